"""How soon the live page (``GET /ui``) shows a call, and the screenshot in docs/operations.md.

    python -m bench.ui_live [--calls 20] [--screenshot docs/ui.png]    (from the repository root)

A real ``tool-retry-sidecar serve`` (``SIDECAR_BACKOFF_BASE_MS=200``, every other setting
at its default) in front of four aiohttp tools on 127.0.0.1: ``weather`` answers each call
503 then 200 and has a schema that makes ``lat`` a number, ``geocode`` answers 404,
``billing`` is down (503, its circuit opens after 5 failed calls), and the ``default``
route's tool always answers.
Debian's headless Chromium, driven over its DevTools protocol as the browser tests do,
shows the page at 1280 x 900 while an agent makes the calls.

For each recovered ``weather`` call: the time from the agent holding its answer to the
page showing that call's row (the page polls once a second; the row is looked for every
few milliseconds). The screenshot is taken the moment the first of them shows, and the
script prints how long after the call that was. Chromium and the sidecar are stopped by
their PIDs before the script returns. Not part of the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.browser import find_chromium, headless_chromium
from tests.processes import sidecar_process
from tests.test_live_page import flaky_tool

Handler = Callable[[web.Request], Awaitable[web.Response]]

ROWS = "document.querySelectorAll('#calls tbody tr')"
# The rows the background calls leave: 2 on geocode, 5 exhausted and 1 refused on billing.
BACKGROUND_ROWS = 8


def answering(status: int) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response({"success": status < 400}, status=status)

    return handler


async def start_tools(workdir: Path) -> tuple[list[web.AppRunner], dict[str, str]]:
    runners, urls = [], {}
    for name, handler in (
        ("weather", flaky_tool()),
        ("default", answering(200)),
        ("geocode", answering(404)),
        ("billing", answering(503)),
    ):
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return runners, urls


def write_config(workdir: Path, urls: dict[str, str]) -> Path:
    schema = workdir / "weather.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"lat": {"type": "number"}}}))
    routes = [
        {"name": name, "prefix": f"/{name}", "upstream": url, "strip_prefix": True}
        for name, url in urls.items()
        if name != "default"
    ]
    routes[0]["schema"] = str(schema)
    config = workdir / "sidecar.json"  # YAML is a superset of JSON
    config.write_text(json.dumps({"routes": routes}))
    return config


async def background_calls(agent: aiohttp.ClientSession, proxy: str) -> None:
    """Some of every kind, so the page shows what each looks like."""
    for number in range(12):
        await (await agent.get(f"{proxy}/search?q=secret-{number}")).read()
    for number in range(2):
        await (await agent.get(f"{proxy}/geocode/place/{number}")).read()
    for _ in range(6):
        await (await agent.post(f"{proxy}/billing/charge", json={"amount": 5})).read()


async def recovered_call(agent: aiohttp.ClientSession, proxy: str) -> float:
    """One weather call that recovers; when its answer was in the agent's hands."""
    answer = await agent.post(
        f"{proxy}/weather/forecast?appid=abc123",
        json={"city": "Oslo", "lat": "59.91", "lon": 10.75},
        headers={"Authorization": "Bearer sk-not-shown"},
    )
    await answer.read()
    assert answer.headers["X-Sidecar-Outcome"] == "recovered", dict(answer.headers)
    return time.monotonic()


async def measure(chromium: str, calls: int, workdir: Path) -> tuple[list[float], bytes, float]:
    """The delay of each call's row, the screenshot and how long after its call it was taken."""
    runners, urls = await start_tools(workdir)
    config = write_config(workdir, urls)
    env = {"SIDECAR_CONFIG_FILE": str(config), "SIDECAR_BACKOFF_BASE_MS": "200"}
    try:
        async with (
            sidecar_process(urls["default"], env) as sidecar,
            headless_chromium(chromium, workdir) as browser,
            aiohttp.ClientSession() as agent,
        ):
            page = await browser.open(f"{sidecar.admin}/ui", width=1280, height=900)
            await page.until("document.querySelectorAll('.route-card').length === 4", 30)
            await background_calls(agent, sidecar.proxy)
            await page.until(f"{ROWS}.length === {BACKGROUND_ROWS}", 30)
            delays: list[float] = []
            for number in range(calls):
                answered_at = await recovered_call(agent, sidecar.proxy)
                await page.until(f"{ROWS}.length === {BACKGROUND_ROWS + number + 1}", 30)
                delays.append(time.monotonic() - answered_at)
                if number == 0:
                    image = await page.screenshot()
                    taken_s = time.monotonic() - answered_at
    finally:
        for runner in runners:
            await runner.cleanup()
    return delays, image, taken_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--screenshot", type=Path, default=Path("docs/ui.png"))
    args = parser.parse_args()
    chromium = find_chromium()
    if chromium is None:
        sys.exit("no chromium on the PATH: apt-get install -y --no-install-recommends chromium")
    with tempfile.TemporaryDirectory(prefix="ui-live-") as workdir:
        delays, image, taken_s = asyncio.run(measure(chromium, args.calls, Path(workdir)))
    args.screenshot.write_bytes(image)
    print(
        f"screenshot {args.screenshot}: the first call's row shown {delays[0]:.2f} s after "
        f"its answer, the image taken {taken_s:.2f} s after it"
    )
    print(
        f"{len(delays)} recovered calls: shown after median {statistics.median(delays):.2f} s, "
        f"max {max(delays):.2f} s (the page polls every 1 s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
