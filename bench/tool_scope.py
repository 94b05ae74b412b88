"""One failing tool among healthy ones behind one route, REST and MCP: what the healthy
tools get with ``SIDECAR_CIRCUIT_SCOPE=tool`` and with ``=route``.

    python bench/tool_scope.py [--rate 20] [--seconds 30] [--only rest|mcp] [--out FILE]

Four tools sit behind one sidecar route: ``search`` always fails with HTTP 503, ``calc``,
``time`` and ``weather`` always answer. REST: an aiohttp tool, one path per tool
(``GET /search?query=…``). MCP: the MCP SDK's server (``MCPServer`` over streamable HTTP, on
uvicorn) with the four tools on one path, ``/mcp``; in front of it, in the same ASGI app, a
gate answers every ``tools/call`` of ``search`` with a plain 503, as a server whose search
backend is down does (the SDK itself answers a failing tool with a 200). The agents are
aiohttp (REST) and ``--agents`` sessions of the MCP SDK's client (MCP). They call the tools
in turn, open loop, ``--rate`` calls a second for ``--seconds``, through a fresh sidecar per
row whose circuit settings are printed. Counted: the healthy tools' 200 answers over their
calls, and the failing tool's answers, latency and requests that reached it. Everything
listens on 127.0.0.1 and every process started is stopped by its PID before the script
returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import orjson
from aiohttp import web
from fault_tool import BUSY
from faults import agent_session, counted, format_ms, open_loop, percentile, proxy, sidecar_settings
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from processes import Bench, free_port
from report import Report
from starlette.types import ASGIApp, Receive, Scope, Send

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.asgi import read_body, replaying, uvicorn_serving  # noqa: E402
from tests.wire import Wire, mcp_client  # noqa: E402

FAILING = "search"
ARGUMENTS: Mapping[str, Mapping[str, Any]] = {
    "search": {"query": "ramen near Shibuya"},
    "calc": {"a": 35.6, "b": 139.7},
    "time": {"zone": "Asia/Tokyo"},
    "weather": {"city": "Tokyo"},
}
TOOLS = tuple(ARGUMENTS)
# Chosen so the circuit acts within a 30 s run: the shipped failures (5) and probes (3);
# a failure rate of 0.2, which one failing tool in four evenly called reaches (the shipped
# 0.5 would keep a route's circuit closed at 25% failures); a 10 s window and 5 s open, so
# a run sees it open, probe and open again.
CIRCUIT = {
    "SIDECAR_CIRCUIT_FAILURES": "5",
    "SIDECAR_CIRCUIT_FAILURE_RATE": "0.2",
    "SIDECAR_CIRCUIT_WINDOW_MS": "10000",
    "SIDECAR_CIRCUIT_OPEN_MS": "5000",
    "SIDECAR_CIRCUIT_HALF_OPEN_PROBES": "3",
}
SCOPES = ("tool", "route")


@dataclass(frozen=True)
class Answer:
    tool: str
    status: int | None  # None: no HTTP answer reached the agent
    said: str  # the sidecar's own error code when it answered itself, else its outcome

    def label(self) -> str:
        return f"{self.status or 'no answer'} {self.said}".strip()


@dataclass
class Seen:
    """What the agents got in one row: every answer, and each tool's call latencies."""

    answers: list[Answer] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})


def sidecar_code(body: bytes) -> str:
    """The error code of an answer the sidecar made itself (``details.source: sidecar``)."""
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if not isinstance(error, dict):
        return ""
    details = error.get("details")
    if isinstance(details, dict) and details.get("source") == "sidecar":
        return str(error.get("code", ""))
    return ""


# --- REST: one aiohttp tool server, a path per tool ---------------------------------------


@dataclass
class RestTools:
    received: Counter[str] = field(default_factory=Counter)  # requests that reached each tool

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{tool}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        tool = request.match_info["tool"]
        self.received[tool] += 1
        if tool == FAILING:
            return web.json_response(BUSY, status=503)
        return web.json_response({"success": True, "data": {"tool": tool}})


async def rest_calls(base: str, rate: float, seconds: float) -> Seen:
    seen = Seen()
    async with agent_session() as session:

        async def one(number: int) -> None:
            tool = TOOLS[number % len(TOOLS)]
            started = time.perf_counter()
            try:
                async with session.get(f"{base}/{tool}", params=ARGUMENTS[tool]) as response:
                    body = await response.read()
            except (aiohttp.ClientError, TimeoutError) as error:
                seen.answers.append(Answer(tool, None, type(error).__name__))
            else:
                said = sidecar_code(body) or response.headers.get("X-Sidecar-Outcome", "")
                seen.answers.append(Answer(tool, response.status, said))
            seen.latencies[tool].append((time.perf_counter() - started) * 1000)

        await open_loop(rate, seconds, one)
    return seen


# --- MCP: the SDK's server and client, one path for every tool ----------------------------


def mcp_server() -> MCPServer:
    server = MCPServer("tool-scope-bench")

    @server.tool()
    async def search(query: str) -> str:
        return f"3 results for {query}"

    @server.tool()
    async def calc(a: float, b: float) -> float:
        return a + b

    @server.tool(name="time")
    async def now(zone: str) -> str:
        return f"12:00 in {zone}"

    @server.tool()
    async def weather(city: str) -> str:
        return f"21.5 °C in {city}"

    return server


def called_tool(body: bytes) -> str:
    """The tool a JSON-RPC ``tools/call`` names; empty for any other message."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return ""
    params = message.get("params")
    return str(params.get("name", "")) if isinstance(params, dict) else ""


class ToolDown:
    """ASGI: a plain ``503`` to every ``tools/call`` of ``tool``, everything else to ``app``;
    counts the ``tools/call`` requests of each tool that reached the server."""

    def __init__(self, app: ASGIApp, tool: str) -> None:
        self.app = app
        self.tool = tool
        self.received: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the caller went away
        name = called_tool(body)
        if name:
            self.received[name] += 1
        if name == self.tool:
            headers = [(b"content-type", b"text/plain; charset=utf-8")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": b"search backend unavailable"})
            return
        await self.app(scope, replaying(body, receive), send)


class ToolCallWire(Wire):
    """Every POST answer, and beside each the tool its ``tools/call`` named (or "")."""

    def __init__(self) -> None:
        super().__init__()
        self.named: list[str] = []

    async def record(self, response: httpx2.Response) -> None:
        await super().record(response)
        # Nothing is awaited between the append above and this one: the lists stay paired.
        if response.request.method == "POST":
            self.named.append(called_tool(response.request.content))


async def mcp_calls(base: str, rate: float, seconds: float, agents: int) -> Seen:
    seen, wire = Seen(), ToolCallWire()
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(mcp_client(f"{base}/mcp", wire)) for _ in range(agents)
        ]

        async def one(number: int) -> None:
            tool = TOOLS[number % len(TOOLS)]
            client = clients[(number // len(TOOLS)) % agents]
            started = time.perf_counter()
            # The SDK raises MCPError for an error answer; what the agent got is on the wire.
            with contextlib.suppress(MCPError):
                await client.call_tool(tool, dict(ARGUMENTS[tool]))
            seen.latencies[tool].append((time.perf_counter() - started) * 1000)

        await open_loop(rate, seconds, one)
    for exchange, tool in zip(wire.exchanges, wire.named, strict=True):
        if exchange.rpc_method == "tools/call":
            said = sidecar_code(exchange.error_body) or exchange.headers.get(
                "x-sidecar-outcome", ""
            )
            seen.answers.append(Answer(tool, exchange.status, said))
    return seen


# --- the run and the report ---------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    tools: str  # "REST" or "MCP"
    scope: str
    seen: Seen
    reached_failing: int  # requests that reached the failing tool

    def healthy_success(self) -> float:
        healthy = [answer for answer in self.seen.answers if answer.tool != FAILING]
        return 100 * sum(answer.status == 200 for answer in healthy) / max(len(healthy), 1)

    def markdown(self) -> str:
        healthy = [answer for answer in self.seen.answers if answer.tool != FAILING]
        failing = [answer for answer in self.seen.answers if answer.tool == FAILING]
        ok = sum(answer.status == 200 for answer in healthy)
        refused = counted(answer.label() for answer in healthy if answer.status != 200)
        return (
            f"| {self.tools} | {self.scope} | {ok} / {len(healthy)} | "
            f"{self.healthy_success():.1f} | {refused} | {len(failing)} | "
            f"{self.reached_failing / max(len(failing), 1):.2f} | "
            f"{counted(answer.label() for answer in failing)} | "
            f"{format_ms(percentile(self.seen.latencies[FAILING], 0.5))} |"
        )


HEADER = (
    "| tools | circuit scope | healthy tools: 200 / calls | healthy success % "
    "| healthy tools' other answers | failing tool: calls | its requests that reached it "
    "per call | its answers | its p50 ms |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def settings(scope: str) -> dict[str, str]:
    return {**CIRCUIT, "SIDECAR_CIRCUIT_SCOPE": scope}


async def rest_rows(bench: Bench, args: argparse.Namespace) -> list[Row]:
    tools = RestTools()
    runner = web.AppRunner(tools.app(), access_log=None, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    rows = []
    try:
        for scope in SCOPES:
            before = tools.received[FAILING]
            async with proxy(bench, "sidecar", port, settings(scope)) as base:
                seen = await rest_calls(base, args.rate, args.seconds)
            rows.append(Row("REST", scope, seen, tools.received[FAILING] - before))
            print(rows[-1].markdown(), file=sys.stderr, flush=True)
    finally:
        await runner.cleanup()
    return rows


async def mcp_rows(bench: Bench, args: argparse.Namespace) -> list[Row]:
    gate = ToolDown(mcp_server().streamable_http_app(), FAILING)
    rows = []
    async with uvicorn_serving(gate) as url:
        port = int(url.rsplit(":", 1)[1])
        for scope in SCOPES:
            before = gate.received[FAILING]
            async with proxy(bench, "sidecar", port, settings(scope)) as base:
                seen = await mcp_calls(base, args.rate, args.seconds, args.agents)
            rows.append(Row("MCP", scope, seen, gate.received[FAILING] - before))
            print(rows[-1].markdown(), file=sys.stderr, flush=True)
    return rows


async def run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    bench = Bench(workdir)
    rows: list[Row] = []
    try:
        if args.only in (None, "rest"):
            rows += await rest_rows(bench, args)
        if args.only in (None, "mcp"):
            rows += await mcp_rows(bench, args)
    finally:
        await asyncio.to_thread(bench.stop_all)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20, help="calls a second, all tools")
    parser.add_argument("--seconds", type=float, default=30, help="per row")
    parser.add_argument("--agents", type=int, default=3, help="MCP client sessions")
    parser.add_argument("--only", choices=("rest", "mcp"))
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    # The SDKs log every failed call; the table says what matters.
    logging.disable(logging.CRITICAL)
    say = Report()

    started = time.monotonic()
    load_before = os.getloadavg()
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    say(f"# One failing tool beside healthy ones: {now}")
    say()
    effective = sidecar_settings(settings("tool"))
    known = "circuit_scope" in effective
    shown = ", ".join(
        f"{name}={effective[name]}"
        for name in sorted(effective)
        if name.startswith(("circuit_", "max_retries", "backoff_", "retry_budget_"))
        and name != "circuit_scope"
    )
    say(
        f"Tools {', '.join(TOOLS)} behind one route; {FAILING} always answers 503. "
        f"{args.rate:g} calls a second for {args.seconds:g} s per row, the tools in turn"
        f" (MCP: {args.agents} SDK client sessions). Sidecar: SIDECAR_CIRCUIT_SCOPE as the "
        f"row says, and {shown}"
        + (
            ""
            if known
            else "; this sidecar does not know SIDECAR_CIRCUIT_SCOPE: every row "
            "has one circuit per route"
        )
        + f". {platform.machine()}, {os.cpu_count()} cores, load average before "
        f"{load_before[0]:.2f}."
    )
    with tempfile.TemporaryDirectory(prefix="sidecar-tool-scope-") as workdir:
        rows = asyncio.run(run(args, Path(workdir)))
    say()
    say(HEADER)
    for row in rows:
        say(row.markdown())
    say()
    for row in rows:
        if row.scope == "tool":
            success = row.healthy_success()
            verdict = "met" if success == 100 else "NOT met"
            say(f"- {row.tools}, tool scope: healthy tools {success:.1f}% success: {verdict}.")
    say.finish(started, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
