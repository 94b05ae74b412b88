"""``tool-retry-sidecar demo``: the demo tool, a sidecar in front of it, a scripted agent.

Everything runs in this process on free loopback ports and is stopped before it returns
(unless ``keep_running``). The LLM scenario uses a real model when ``SIDECAR_LLM_*`` or
``OPENAI_*`` point at one; without one the demo says so and shows the tool's real answer
reaching the agent unchanged — it never fakes a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import load_settings
from sidecar.demo.tool import API_KEY, ToolLog, create_tool_app
from sidecar.serve.app import LIFECYCLE, create_admin_app, create_app, proxy_server, running

# Short waits so the whole demo runs in a few seconds; the tool's own Retry-After (1 s) is
# honoured as it is.
DEMO_SETTINGS = {
    "backoff_base_ms": 200,
    "backoff_max_ms": 1000,
    "log_level": "error",
}


@dataclass(frozen=True, slots=True)
class Scenario:
    title: str
    method: str
    path: str
    payload: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # A scenario only a model can recover: its title ends with ``with_llm`` when one is
    # configured and with ``without_llm`` when none is.
    with_llm: str = ""
    without_llm: str = ""
    note: str = ""

    @property
    def needs_llm(self) -> bool:
        return bool(self.with_llm)

    def heading(self, has_llm: bool) -> str:
        if not self.needs_llm:
            return self.title
        return f"{self.title}: {self.with_llm if has_llm else self.without_llm}"

    @property
    def body(self) -> bytes | None:
        """The request body exactly as the agent sends it, so the demo can print those bytes."""
        return None if self.payload is None else orjson.dumps(self.payload)


SCENARIOS = (
    Scenario(
        "A 503 burst: retried with backoff until the tool recovers",
        "POST",
        "/weather/current",
        {"location": "Tokyo, Japan", "burst": True},
    ),
    Scenario(
        "A 429 with Retry-After: the tool's own wait is honoured",
        "POST",
        "/weather/forecast",
        {"location": "Lisbon, Portugal", "days": 3},
    ),
    Scenario(
        '"lat": "35.6" as a string: coerced to the OpenAPI schema before sending',
        "POST",
        "/weather/point",
        {"lat": "35.6", "lon": "139.7", "hourly": "true"},
        note="without the schema this tool answers: 400 json: cannot unmarshal string into "
        "Go struct field PointRequest.lat of type float64",
    ),
    Scenario(
        "A MIRA parameter_adjustments suggestion: applied as the tool asked",
        "POST",
        "/weather/convert",
        {"value_c": 21.5, "units": "kelvin"},
    ),
    Scenario(
        "A city the tool knows only as 'City, State, Country'",
        "POST",
        "/weather/current",
        {"location": "Flower Mound, TX", "units": "metric"},
        headers={"X-Sidecar-Intent": "What's the weather in Flower Mound, TX right now?"},
        with_llm="repaired by the LLM",
        without_llm="only an LLM could repair it, and none is configured",
    ),
    Scenario(
        "An auth error: never retried, the agent gets the tool's answer at once",
        "GET",
        "/weather/alerts",
        headers={"X-Api-Key": "wrong-" + API_KEY},
    ),
)


async def run_demo(
    out: TextIO,
    *,
    keep_running: bool = False,
    settings_overrides: dict[str, Any] | None = None,
) -> int:
    """Play every scenario and print what happened; 0 when each ended as it should."""
    tool_app, tool_log = create_tool_app()
    tool_runner = web.AppRunner(tool_app, access_log=None)
    await tool_runner.setup()
    await web.TCPSite(tool_runner, "127.0.0.1", 0).start()
    tool_url = f"http://127.0.0.1:{tool_runner.addresses[0][1]}"

    settings = load_settings(
        host="127.0.0.1",
        routes=[
            {
                "name": "weather",
                "prefix": "/weather",
                "upstream": tool_url,
                "schema": f"{tool_url}/openapi.json",
            }
        ],
        **{**DEMO_SETTINGS, **(settings_overrides or {})},
    ).served()
    sidecar_app = create_app(settings)
    started = contextlib.AsyncExitStack()
    await started.enter_async_context(running(sidecar_app))
    sidecar = proxy_server(sidecar_app, settings)
    admin_runner = web.AppRunner(create_admin_app(sidecar_app), access_log=None)
    await sidecar.start("127.0.0.1", 0, backlog=128)
    await admin_runner.setup()
    await web.TCPSite(admin_runner, "127.0.0.1", 0).start()
    sidecar_app[LIFECYCLE].ready = True
    sidecar_url = f"http://127.0.0.1:{sidecar.port}"
    admin_url = f"http://127.0.0.1:{admin_runner.addresses[0][1]}"
    has_llm = settings.llm_base_url is not None or settings.llm_api_key is not None

    write = _writer(out)
    write(f"tool-retry-sidecar demo: weather tool at {tool_url}, sidecar at {sidecar_url}")
    write(
        "LLM repair: "
        + (f"on ({settings.llm_model})" if has_llm else "off (no SIDECAR_LLM_* / OPENAI_* set)")
    )
    failures = 0
    try:
        async with aiohttp.ClientSession() as agent:
            for number, scenario in enumerate(SCENARIOS, start=1):
                report = await _play(agent, sidecar_url, scenario, tool_log)
                write("")
                write(f"{number}. {scenario.heading(has_llm)}")
                for line in report.lines(has_llm):
                    write(f"   {line}")
                failures += not report.as_expected(has_llm)
            async with agent.get(f"{admin_url}/metrics") as metrics:
                write("")
                for line in summary(await metrics.text()):
                    write(line)
        if keep_running:
            _print_curl_lines(write, sidecar_url, admin_url)
            await _wait_for_signal()
    finally:
        await sidecar.close(grace_s=0.25)
        await admin_runner.cleanup()
        await started.aclose()
        await tool_runner.cleanup()
    return 1 if failures else 0


@dataclass
class _Report:
    scenario: Scenario
    request_id: str
    status: int
    headers: dict[str, str]
    body: bytes
    tool_saw: list[Any]

    @property
    def outcome(self) -> str:
        return self.headers.get("X-Sidecar-Outcome", "?")

    def as_expected(self, has_llm: bool) -> bool:
        if self.scenario.needs_llm and not has_llm:
            return self.status == 404 and self.outcome == "not-retryable"
        if self.scenario.method == "GET":
            return self.status == 401 and self.outcome == "not-retryable"
        return self.status == 200 and self.outcome in ("ok", "recovered")

    def lines(self, has_llm: bool) -> list[str]:
        scenario = self.scenario
        if scenario.body is not None:
            sent = _json_bytes(scenario.body)
        else:
            sent = ", ".join(f"{k}: {v}" for k, v in scenario.headers.items())
        lines = [f"agent sent   {scenario.method} {scenario.path} {sent}"]
        for attempt, seen in enumerate(self.tool_saw, start=1):
            got = _json_bytes(seen.body) or "(no body)"
            lines.append(f"attempt {attempt}    tool got {got} -> {seen.status}")
        lines.append(f"sidecar      {self.headers.get('X-Sidecar-Trail', '')}")
        repaired = self.headers.get("X-Sidecar-Repaired")
        lines.append(
            f"agent got    {self.status} ({self.outcome}"
            + (f", repaired by {repaired}" if repaired else "")
            + f") {_json_bytes(self.body)}"
        )
        if scenario.note:
            lines.append(f"note         {scenario.note}")
        if scenario.needs_llm and not has_llm:
            lines.append(
                "note         this scenario needs an LLM: set SIDECAR_LLM_BASE_URL (and "
                "SIDECAR_LLM_API_KEY) or OPENAI_API_KEY; without one, the tool's real answer "
                "reached the agent unchanged"
            )
        return lines


async def _play(
    agent: aiohttp.ClientSession, sidecar_url: str, scenario: Scenario, tool_log: ToolLog
) -> _Report:
    request_id = f"demo-{uuid.uuid4().hex[:12]}"
    headers = {"X-Request-ID": request_id, **scenario.headers}
    if scenario.body is not None:
        headers["Content-Type"] = "application/json"
    async with agent.request(
        scenario.method, sidecar_url + scenario.path, data=scenario.body, headers=headers
    ) as response:
        body = await response.read()
        return _Report(
            scenario,
            request_id,
            response.status,
            dict(response.headers),
            body,
            tool_log.for_request(request_id),
        )


def summary(metrics_text: str) -> list[str]:
    """A table of what the sidecar counted, read from its own /metrics text: its own
    counters, not the process and Python ones the same page carries."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not (sample.name.startswith("sidecar_") and sample.name.endswith("_total")):
                continue
            labels = ",".join(
                f"{key}={value}" for key, value in sorted(sample.labels.items()) if key != "route"
            )
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            counts[key] = counts.get(key, 0.0) + sample.value
    rows = [(name, value) for name, value in sorted(counts.items()) if value]
    width = max((len(name) for name, _ in rows), default=10)
    lines = ["Summary, from the sidecar's /metrics:", f"  {'metric':<{width}}  value"]
    lines += [f"  {name:<{width}}  {value:g}" for name, value in rows]
    return lines


def _print_curl_lines(write: Callable[[str], None], sidecar_url: str, admin_url: str) -> None:
    write("")
    write("The tool and the sidecar keep running; try (Ctrl-C to stop):")
    write(
        f"  curl -si {sidecar_url}/weather/current -H 'Content-Type: application/json' "
        """-d '{"location": "Tokyo, Japan", "burst": true}'"""
    )
    write(
        f"  curl -si {sidecar_url}/weather/point -H 'Content-Type: application/json' "
        """-d '{"lat": "35.6", "lon": "139.7"}'"""
    )
    write(f"  curl -s {admin_url}/metrics | grep ^sidecar_")
    write(f"  {admin_url}/ui in a browser: each route, and the calls above, live")


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _writer(out: TextIO) -> Callable[[str], None]:
    def write(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    return write


def _json_bytes(body: bytes, limit: int = 160) -> str:
    """``body`` on one line; past ``limit`` cut after a whole word, saying it was cut."""
    text = re.sub(r"\s+", " ", body.decode("utf-8", "replace")).strip()
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return f"{text[: cut if cut > 0 else limit]} … ({len(body)} bytes in all)"
