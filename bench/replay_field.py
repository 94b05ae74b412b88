"""Replay safety in the field: issue 11's scenarios against a real ``tool-retry-sidecar serve``.

    python -m bench.replay_field [--only NAME ...]      (from the repository root)

Each scenario puts a tool nobody here wrote (the MCP SDK's server on uvicorn, an aiohttp
server, a fake OpenAI endpoint) behind its own sidecar process, configured as the issue
says, and makes one call through it as an agent would (the MCP SDK's client, the
``openai`` client, aiohttp). Per scenario it prints how often the tool ran the call
(counted in the tool), the attempts the sidecar reported (``X-Sidecar-Attempts`` of each
answer the agent received), the sidecar's outcome, and what the agent got.

The sizes are the issue's. Scenarios run at once, so the longest bounds the run: a 35 s
completion under the default 120 s deadline. Everything listens on 127.0.0.1; every
sidecar process is stopped by its PID before the script returns. Not part of the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import anyio
import openai
import orjson
from aiohttp import web
from mcp import MCPError
from mcp.server.mcpserver import MCPServer

from tests.asgi import uvicorn_serving
from tests.wire import Exchange, Wire, mcp_client

SIDECAR = str(Path(sys.executable).with_name("tool-retry-sidecar"))
RUN_BOUND_S = 300  # far above the slowest scenario (the 120 s deadline); a hang stops here
PAYMENT_FAILED = "payment captured but receipt write failed"


@dataclass
class Row:
    scenario: str
    setup: str
    tool_ran: int
    attempts: str  # X-Sidecar-Attempts of each answer the agent received, joined by "+"
    outcome: str
    agent_got: str
    seconds: float


@dataclass
class Observed:
    """One scenario's call: what the tool counted and what the agent received."""

    tool_ran: int
    answers: list[Exchange]  # every answer the agent received for the call, in order
    got: str  # what the agent's client made of them, when it is more than a status
    seconds: float  # from the agent's call to what it got


Run = Callable[[], Awaitable[Observed]]


@dataclass
class Scenario:
    name: str
    setup: str
    run: Run


# --- the processes and servers every scenario is made of ------------------------------------


@asynccontextmanager
async def sidecar_serving(upstream: str, **settings: str) -> AsyncIterator[str]:
    """``tool-retry-sidecar serve`` in front of ``upstream``; its proxy URL."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SIDECAR_", "OPENAI_", "GOMIND_AGENT_"))
    }
    environment.update({f"SIDECAR_{name.upper()}": value for name, value in settings.items()})
    environment["SIDECAR_HOST"] = "127.0.0.1"
    process = await asyncio.create_subprocess_exec(
        SIDECAR,
        "serve",
        "--upstream",
        upstream,
        "--port",
        "0",
        "--admin-port",
        "0",
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    # Its log goes nowhere, but must be read: a full pipe would stall the sidecar.
    draining: asyncio.Task[bytes] | None = None
    try:
        started = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=60))
        draining = asyncio.create_task(process.stdout.read())
        yield f"http://127.0.0.1:{started['proxy_port']}"
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=20)
            except TimeoutError:
                process.kill()
                await process.wait()
        if draining is not None:
            await draining


Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class HttpTool:
    url: str = ""
    received: int = 0  # requests that reached the tool, counted as they arrive


@asynccontextmanager
async def aiohttp_serving(answer: Answer) -> AsyncIterator[HttpTool]:
    """A tool on aiohttp that reads every request, counts it, and answers with ``answer``."""
    tool = HttpTool()

    async def counted(request: web.Request) -> web.StreamResponse:
        tool.received += 1
        await request.read()
        return await answer(request)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", counted)
    # A handler still running for a caller that left is not waited for at the end.
    runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        tool.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield tool
    finally:
        await runner.cleanup()


def summary(exchange: Exchange) -> str:
    """An answer as the agent received it: status, and the sidecar's own code if it spoke."""
    text = f"HTTP {exchange.status}"
    if exchange.error_body:
        try:
            error = orjson.loads(exchange.error_body).get("error") or {}
        except orjson.JSONDecodeError:
            error = {}
        if isinstance(error, dict) and error.get("code"):
            text += f" {error['code']}"
            details = error.get("details")
            if isinstance(details, dict) and "delivered" in details:
                text += f" delivered={details['delivered']}"
    if "x-should-retry" in exchange.headers:
        text += f" x-should-retry={exchange.headers['x-should-retry']}"
    return text


def mcp_errors(raised: BaseException) -> list[MCPError]:
    if isinstance(raised, BaseExceptionGroup):
        return [leaf for inner in raised.exceptions for leaf in mcp_errors(inner)]
    return [raised] if isinstance(raised, MCPError) else []


# --- MCP: the SDK's server as the tool, the SDK's client as the agent ---------------------


def mcp_server(runs: list[str], *, seconds: float = 0, fails: bool = False) -> MCPServer:
    server = MCPServer("field-bench")

    @server.tool()
    async def settle(invoice: str) -> str:
        runs.append(invoice)
        if fails:
            raise MCPError(-32603, PAYMENT_FAILED)
        await anyio.sleep(seconds)
        return f"settled {invoice}"

    return server


def mcp_scenario(
    *, seconds: float = 0, fails: bool = False, json_response: bool = False, mode: str, **env: str
) -> Run:
    async def run() -> Observed:
        runs: list[str] = []
        app = mcp_server(runs, seconds=seconds, fails=fails).streamable_http_app(
            json_response=json_response
        )
        wire = Wire()
        async with uvicorn_serving(app) as url, sidecar_serving(url, **env) as proxy:
            called = time.monotonic()
            try:
                async with mcp_client(f"{proxy}/mcp", wire, mode=mode) as client:
                    called = time.monotonic()
                    result = await client.call_tool("settle", {"invoice": "inv-7"})
                    took = time.monotonic() - called
                got = f"result {result.content[0].text!r}"
            except (MCPError, ExceptionGroup) as raised:
                took = time.monotonic() - called
                got = "; ".join(
                    f"SDK raised MCPError {error.code} {error.message!r}"
                    for error in mcp_errors(raised)
                )
        return Observed(len(runs), wire.tool_calls(), got, took)

    return run


# --- HTTP tools on aiohttp ----------------------------------------------------------------

COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
}
CHAT = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}


def chat_scenario(answer: Answer, *, max_retries: int) -> Run:
    """The ``openai`` client through the sidecar to a model that answers with ``answer``."""

    async def run() -> Observed:
        wire = Wire()
        async with aiohttp_serving(answer) as model, sidecar_serving(model.url) as proxy:
            client = openai.AsyncOpenAI(
                base_url=f"{proxy}/v1",
                api_key="sk-bench",
                max_retries=max_retries,
                http_client=wire.client(),
            )
            async with client:
                started = time.monotonic()
                try:
                    completion = await client.chat.completions.create(**CHAT)
                    got = f"completion {completion.choices[0].message.content!r}"
                except openai.APIError as error:
                    got = f"{type(error).__name__} after {len(wire.exchanges)} answer(s)"
                seconds = time.monotonic() - started
        return Observed(model.received, wire.exchanges, got, seconds)

    return run


async def slow_completion(_: web.Request) -> web.Response:
    await asyncio.sleep(35)
    return web.json_response(COMPLETION)


async def rate_limited(_: web.Request) -> web.Response:
    return web.json_response(
        {"error": {"message": "Rate limit reached", "type": "requests"}},
        status=429,
        headers={"Retry-After": "1"},
    )


async def dropped(request: web.Request) -> web.Response:
    """Close the connection without an answer."""
    request.transport.close()
    return web.Response()


def drop_scenario(method: str) -> Run:
    """aiohttp as the agent, through the sidecar to a tool that drops every connection."""

    async def run() -> Observed:
        async with (
            aiohttp_serving(dropped) as tool,
            sidecar_serving(tool.url) as proxy,
            aiohttp.ClientSession() as agent,
        ):
            body = b'{"name": "lamp"}' if method == "PUT" else None
            started = time.monotonic()
            async with agent.request(method, f"{proxy}/items/7", data=body) as answer:
                exchange = Exchange(None, answer.status, answer.headers, await answer.read())
            seconds = time.monotonic() - started
        return Observed(tool.received, [exchange], "", seconds)

    return run


SCENARIOS = [
    Scenario(
        "mcp-8s-sse-handshake",
        "MCP SDK, handshake-era SSE, tool 8 s, PER_TRY_TIMEOUT_MS=3000",
        mcp_scenario(seconds=8, mode="legacy", per_try_timeout_ms="3000"),
    ),
    Scenario(
        "mcp-8s-2026",
        "MCP SDK 2.x default client (2026-07-28), tool 8 s, PER_TRY_TIMEOUT_MS=3000",
        mcp_scenario(seconds=8, mode="auto", per_try_timeout_ms="3000"),
    ),
    Scenario(
        "mcp-json-35s-handshake",
        "MCP SDK json_response=True, handshake-era, tool 35 s, defaults",
        mcp_scenario(seconds=35, json_response=True, mode="legacy"),
    ),
    Scenario(
        "mcp-json-35s-2026",
        "MCP SDK json_response=True, 2.x default client, tool 35 s, defaults",
        mcp_scenario(seconds=35, json_response=True, mode="auto"),
    ),
    Scenario(
        "mcp-32603",
        "MCP SDK tool fails with JSON-RPC -32603, defaults",
        mcp_scenario(fails=True, mode="auto"),
    ),
    Scenario(
        "chat-35s",
        "openai client (max_retries=0), non-streaming completion 35 s, defaults",
        chat_scenario(slow_completion, max_retries=0),
    ),
    Scenario(
        "openai-429",
        "openai client (default max_retries=2), model always 429 Retry-After 1, defaults",
        chat_scenario(rate_limited, max_retries=2),
    ),
    *(
        Scenario(
            f"drop-{method}",
            f"aiohttp agent, {method} to a tool that drops the connection, defaults",
            drop_scenario(method),
        )
        for method in ("PUT", "GET", "DELETE")
    ),
]


async def measure(scenario: Scenario) -> Row:
    try:
        seen = await scenario.run()
    except Exception as error:  # one broken scenario must not hide the others' rows
        return Row(scenario.name, scenario.setup, -1, "-", "-", f"bench error: {error!r}", 0)
    answers = seen.answers
    return Row(
        scenario.name,
        scenario.setup,
        seen.tool_ran,
        "+".join(answer.headers.get("x-sidecar-attempts", "-") for answer in answers) or "-",
        "+".join(answer.headers.get("x-sidecar-outcome", "-") for answer in answers) or "-",
        "; ".join(part for part in (summary(answers[-1]) if answers else "", seen.got) if part),
        seen.seconds,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| scenario | setup | tool ran | attempts reported | outcome | the agent got | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.scenario} | {row.setup} | {row.tool_ran} | {row.attempts} | {row.outcome} "
            f"| {row.agent_got} | {row.seconds:.1f} |"
        )
    return "\n".join(lines)


async def measure_all(scenarios: list[Scenario]) -> list[Row]:
    async with asyncio.timeout(RUN_BOUND_S):
        return list(await asyncio.gather(*(measure(scenario) for scenario in scenarios)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="scenario names (or prefixes) to run")
    args = parser.parse_args()
    chosen = [
        scenario
        for scenario in SCENARIOS
        if not args.only or any(scenario.name.startswith(prefix) for prefix in args.only)
    ]
    # The SDKs log every request and every failing tool; the table says what matters.
    logging.disable(logging.CRITICAL)
    version = subprocess.run(
        [SIDECAR, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"{version}; {len(chosen)} scenario(s) at once, on 127.0.0.1", flush=True)
    print(table(asyncio.run(measure_all(chosen))))


if __name__ == "__main__":
    main()
