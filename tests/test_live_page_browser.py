"""The live page in a real headless browser (Debian's ``chromium``), in front of a real
sidecar and a real flaky tool: it shows each recovered call as it happens, without a
reload, and nothing secret ever reaches it.

Skipped when no ``chromium`` is installed, except under CI, where that fails.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from sidecar.serve.app import create_admin_app
from tests.browser import Page, chromium_or_skip, headless_chromium
from tests.test_live_page import SECRETS, call_with_secrets, flaky_tool, ok, weather_routes

# Generous bounds for a busy two-core machine: the page polls once a second.
SHOWN_WITHIN_S = 15.0

ROWS = "[...document.querySelectorAll('#calls tbody tr')]"
CARDS = "[...document.querySelectorAll('.route-card')]"
TRAILS = f"{ROWS}.map(row => [...row.querySelectorAll('.token')].map(t => t.textContent))"


@pytest.fixture
async def browser(tmp_path):
    async with headless_chromium(chromium_or_skip(), tmp_path) as running:
        yield running


async def page_trails(page: Page) -> list[list[str]]:
    return await page.evaluate(TRAILS)


async def shows_trails(page: Page, count: int) -> None:
    await page.until(f"{ROWS}.length === {count}", SHOWN_WITHIN_S)


async def test_a_recovered_call_shows_up_live_and_nothing_secret_does(
    make_tool, make_sidecar, aiohttp_server, browser, tmp_path
):
    flaky, quiet = await make_tool(flaky_tool()), await make_tool(ok)
    sidecar = await make_sidecar(routes=weather_routes(flaky.url, quiet.url, tmp_path))
    admin = await aiohttp_server(create_admin_app(sidecar.app))
    page = await browser.open(str(admin.make_url("/ui")))
    await page.until("document.querySelectorAll('.route-card').length === 2", SHOWN_WITHIN_S)
    assert await page.evaluate(f"{CARDS}.map(card => card.querySelector('h3').textContent)") == [
        "weather",
        "quiet",
    ]
    await page.evaluate("window.sameDocument = true")

    first = await call_with_secrets(sidecar.client)
    await shows_trails(page, 1)
    shown_first = await page_trails(page)
    second = await call_with_secrets(sidecar.client)
    await shows_trails(page, 2)

    assert first.headers["X-Sidecar-Outcome"] == second.headers["X-Sidecar-Outcome"] == "recovered"
    assert shown_first == [first.headers["X-Sidecar-Trail"].split(", ")]
    # Newest first, and the same document all along: no reload.
    assert await page_trails(page) == [
        second.headers["X-Sidecar-Trail"].split(", "),
        first.headers["X-Sidecar-Trail"].split(", "),
    ]
    assert await page.evaluate("window.sameDocument") is True
    assert await page.evaluate(f"{ROWS}.map(row => row.querySelector('.route').textContent)") == [
        "weather",
        "weather",
    ]
    await page.until(
        "document.querySelector('[data-route=weather] dd.recovered').textContent === '2'",
        SHOWN_WITHIN_S,
    )
    assert "coercion: lat" in await page.evaluate(f"{ROWS}[0].textContent")
    dom = await page.evaluate("document.documentElement.outerHTML")
    state = await (await sidecar.client.session.get(admin.make_url("/ui/state.json"))).text()
    for secret in (*SECRETS, "api_key", "Bearer"):
        assert secret not in dom
        assert secret not in state
    assert_only_the_admin_port_was_asked(page, str(admin.make_url("/")))
    assert page.events("Runtime.exceptionThrown") == []


def assert_only_the_admin_port_was_asked(page: Page, origin: str) -> None:
    asked = {event["request"]["url"] for event in page.events("Network.requestWillBeSent")}
    assert asked and all(url.startswith(origin) for url in asked), asked
    assert {origin + "ui", origin + "ui/ui.js", origin + "ui/ui.css"} <= asked


async def test_the_page_fits_a_phone_screen(make_tool, make_sidecar, aiohttp_server, browser):
    sidecar = await make_sidecar(await make_tool(flaky_tool()))
    admin = await aiohttp_server(create_admin_app(sidecar.app))
    page = await browser.open(str(admin.make_url("/ui")), width=390, height=844)

    await sidecar.client.get("/forecast?city=Oslo")
    await shows_trails(page, 1)
    widths: dict[str, Any] = await page.evaluate(
        "({page: document.documentElement.scrollWidth, screen: window.innerWidth,"
        " head: getComputedStyle(document.querySelector('#calls thead')).display})"
    )

    assert widths["page"] <= widths["screen"] == 390, json.dumps(widths)
    assert widths["head"] == "none"  # each call is a card of labelled lines


async def test_a_route_of_many_tools_lists_those_not_closed_and_counts_the_rest(
    make_tool, make_sidecar, aiohttp_server, browser
):
    async def one_tool_down(request: web.Request) -> web.Response:
        if request.path == "/billing":
            return web.json_response({"error": "down"}, status=503)
        return web.json_response({"success": True})

    sidecar = await make_sidecar(
        await make_tool(one_tool_down), max_retries=0, circuit_failures=1, circuit_min_calls=0
    )
    for tool in ("billing", *(f"tool-{number}" for number in range(7))):
        await sidecar.client.get(f"/{tool}")
    admin = await aiohttp_server(create_admin_app(sidecar.app))
    page = await browser.open(str(admin.make_url("/ui")))
    await page.until("document.querySelectorAll('.circuits li').length > 0", SHOWN_WITHIN_S)

    lines = await page.evaluate(
        "[...document.querySelectorAll('.circuits li')].map(li => li.textContent)"
    )

    assert [line.split(", probe in")[0] for line in lines] == ["/billing: open", "7 tools closed"]
