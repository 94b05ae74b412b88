"""Replay safety against software nobody here wrote: a call the agent made once runs at the tool
once, or once per attempt the sidecar reports, never more.

The tools are the official MCP SDK's server (``MCPServer``), FastAPI and aiohttp, served on
127.0.0.1; the agents are the MCP SDK's streamable-HTTP client, the ``openai`` client and
aiohttp. Every test counts executions where they happen: in the tool.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import openai
import orjson
import pytest
from aiohttp import web
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from mcp import Client, MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from tests.asgi import uvicorn_serving
from tests.conftest import Sidecar, Tool, completion, scripted
from tests.wire import Wire, leaf_errors, mcp_client, orders_failing_once, own_error

PER_TRY_MS = 1000  # every slow tool below takes longer than this
SLOW_S = 2.2  # longer than the per-try timeout and the default inspection window (2 s)
GAVE_UP = {"exhausted", "not-retryable", "budget-exhausted", "deadline", "unreachable"}


def assert_maybe_delivered(status: int, headers: Any, body: bytes, code: str) -> None:
    """The sidecar's own answer for a call it sent once and will not send again."""
    expected_status = {"UPSTREAM_TIMEOUT": 504, "UPSTREAM_RESET": 502}[code]
    error = own_error(status, body)
    assert (error.status, headers["X-Sidecar-Attempts"]) == (expected_status, "1")
    assert error.code == code
    assert error.details.get("delivered") == "maybe"
    assert error.details["source"] == "sidecar"
    assert headers["X-Sidecar-Outcome"] in GAVE_UP
    assert headers["x-should-retry"] == "false"


# --- the MCP SDK: its server as the tool, its streamable-HTTP client as the agent ----------


@asynccontextmanager
async def mcp_agent(
    server: MCPServer,
    make_sidecar: Callable[..., Any],
    *,
    json_response: bool = False,
    mode: str = "auto",
    **settings: Any,
) -> AsyncIterator[tuple[Client, Wire]]:
    """``server`` on uvicorn, a sidecar in front of it, and the SDK's client through both."""
    async with uvicorn_serving(server.streamable_http_app(json_response=json_response)) as url:
        sidecar = await make_sidecar(url, **settings)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode=mode) as client:
            yield client, wire


@pytest.mark.parametrize(
    ("mode", "reports_progress", "seconds"),
    [("legacy", False, SLOW_S), ("auto", True, 2.4)],
    ids=["handshake-era-sse", "2026-sse-with-progress"],
)
async def test_mcp_slow_tool_streamed_as_sse_runs_once_and_its_result_arrives(
    make_sidecar, mode, reports_progress, seconds
):
    """The SSE head comes at once (on the 2026 protocol only once the tool reports
    progress); the result only when the tool is done, past the per-try timeout and the
    inspection window. The stream passed on commits the attempt: one run, and the agent gets
    its result. A tool that reports progress lives on while it reports, each report within
    the per-try timeout of the last."""
    runs: Counter[str] = Counter()
    server = MCPServer("field")

    @server.tool()
    async def settle(invoice: str, ctx: Context) -> str:
        runs["settle"] += 1
        if not reports_progress:
            await anyio.sleep(seconds)
        for step in range(4 if reports_progress else 0):
            await ctx.report_progress(step, 4)
            await anyio.sleep(seconds / 4)
        return f"settled {invoice}"

    async def progress(*_: Any) -> None:
        """Asking for progress gives the call the token the tool reports progress under."""

    async with mcp_agent(server, make_sidecar, mode=mode, per_try_timeout_ms=PER_TRY_MS) as (
        client,
        wire,
    ):
        result = await client.call_tool("settle", {"invoice": "inv-7"}, progress_callback=progress)

    assert not result.is_error
    assert result.content[0].text == "settled inv-7"
    assert runs["settle"] == 1
    [call] = wire.tool_calls()
    assert call.headers["content-type"].startswith("text/event-stream")
    assert call.headers["X-Sidecar-Attempts"] == "1"


async def test_mcp_json_response_tool_slower_than_per_try_runs_once_and_the_agent_hears_maybe(
    make_sidecar,
):
    """``json_response=True``: no head until the tool is done. The per-try timeout passes
    with the call delivered; under ``safe`` it is not sent again."""
    runs: Counter[str] = Counter()
    server = MCPServer("field")

    @server.tool()
    async def transfer(amount: int) -> str:
        runs["transfer"] += 1
        await anyio.sleep(SLOW_S)
        return f"moved {amount}"

    with pytest.raises((MCPError, ExceptionGroup)) as raised:
        async with mcp_agent(
            server, make_sidecar, json_response=True, per_try_timeout_ms=PER_TRY_MS
        ) as (client, wire):
            await client.call_tool("transfer", {"amount": 100})

    # The SDK hands the call the sidecar's JSON-RPC error, its reason in ``data``.
    surfaced = [error for error in leaf_errors(raised.value) if isinstance(error, MCPError)]
    assert [(error.code, error.data["code"]) for error in surfaced] == [
        (-32000, "UPSTREAM_TIMEOUT")
    ]
    assert runs["transfer"] == 1
    [call] = wire.tool_calls()
    assert_maybe_delivered(call.status, call.headers, call.body, "UPSTREAM_TIMEOUT")


async def test_mcp_failing_tools_run_once(make_sidecar):
    """Tools that failed after doing part of their work: the failure goes back, the work is
    not done again (an ``isError`` result is for repair only; a JSON-RPC error is final)."""
    runs: Counter[str] = Counter()
    server = MCPServer("field")

    @server.tool()
    async def capture(order: str) -> str:
        runs["capture"] += 1
        raise RuntimeError("card declined after the hold was placed")

    @server.tool()
    async def settle(order: str) -> str:
        runs["settle"] += 1
        raise MCPError(-32603, "payment captured but receipt write failed")

    async with mcp_agent(server, make_sidecar) as (client, wire):
        captured = await client.call_tool("capture", {"order": "o-1"})
        with pytest.raises(MCPError) as settled:
            await client.call_tool("settle", {"order": "o-1"})

    assert captured.is_error
    assert (settled.value.code, settled.value.message) == (
        -32603,
        "payment captured but receipt write failed",
    )
    assert runs == {"capture": 1, "settle": 1}
    assert [call.headers["X-Sidecar-Attempts"] for call in wire.tool_calls()] == ["1", "1"]


async def test_mcp_jsonrpc_error_is_replayed_only_when_the_server_marks_it_retryable(
    make_sidecar,
):
    """``error.data.retryable: true`` is the server's word that the call took no effect: it
    is sent again, annotated or not (``place_order``); without it (``cancel_order``) a
    JSON-RPC error goes back as it came."""
    server, runs = orders_failing_once("field")

    async with mcp_agent(server, make_sidecar) as (client, wire):
        await client.list_tools()
        placed = await client.call_tool("place_order", {"symbol": "ACME"})
        with pytest.raises(MCPError) as refused:
            await client.call_tool("cancel_order", {"symbol": "ACME"})

    assert placed.content[0].text == "place_order run 2"
    assert (refused.value.code, refused.value.message) == (-32603, "price feed warming up")
    assert runs == {"place_order": 2, "cancel_order": 1}
    place_call, cancel_call = wire.tool_calls()
    assert place_call.headers["X-Sidecar-Attempts"] == "2"
    assert place_call.headers["X-Sidecar-Outcome"] == "recovered"
    assert cancel_call.headers["X-Sidecar-Attempts"] == "1"


async def test_mcp_tools_annotated_safe_are_replayed_after_a_per_try_timeout(make_sidecar):
    """The server annotated these tools ``readOnlyHint`` / ``idempotentHint`` in a
    ``tools/list`` that passed through the sidecar: a delivered call may be sent again."""
    runs: Counter[str] = Counter()
    server = MCPServer("field")

    async def slow_first_time(name: str) -> str:
        runs[name] += 1
        if runs[name] == 1:
            await anyio.sleep(SLOW_S)
        return f"{name} run {runs[name]}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        return await slow_first_time("lookup")

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
    async def put_setting(key: str, value: str) -> str:
        return await slow_first_time("put_setting")

    async with mcp_agent(
        server, make_sidecar, json_response=True, per_try_timeout_ms=PER_TRY_MS
    ) as (client, wire):
        await client.list_tools()
        looked_up, stored = await asyncio.gather(
            client.call_tool("lookup", {"key": "k"}),
            client.call_tool("put_setting", {"key": "k", "value": "v"}),
        )

    assert looked_up.content[0].text == "lookup run 2"
    assert stored.content[0].text == "put_setting run 2"
    assert runs == {"lookup": 2, "put_setting": 2}
    reported = [
        (call.headers["X-Sidecar-Attempts"], call.headers["X-Sidecar-Outcome"])
        for call in wire.tool_calls()
    ]
    assert reported == [("2", "recovered")] * 2


async def test_mcp_a_slow_read_only_tool_is_hedged_and_an_unannotated_one_never(make_sidecar):
    """Hedging against the MCP SDK's server: only the tool its ``tools/list`` marked
    ``readOnlyHint`` gets a second copy; the other runs once however slow it is."""
    runs: Counter[str] = Counter()
    server = MCPServer("field")

    async def slow_first_time(name: str) -> str:
        runs[name] += 1
        if runs[name] == 1:
            await anyio.sleep(0.6)
        return f"{name} run {runs[name]}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        return await slow_first_time("lookup")

    @server.tool()
    async def send_email(to: str) -> str:
        return await slow_first_time("send_email")

    async with mcp_agent(server, make_sidecar, json_response=True, hedge_after_ms=100) as (
        client,
        wire,
    ):
        await client.list_tools()
        looked_up = await client.call_tool("lookup", {"key": "k"})
        sent = await client.call_tool("send_email", {"to": "a@example.com"})

    assert looked_up.content[0].text == "lookup run 2"
    assert sent.content[0].text == "send_email run 1"
    assert runs == {"lookup": 2, "send_email": 1}
    lookup_call, email_call = wire.tool_calls()
    assert lookup_call.headers["X-Sidecar-Trail"] == "hedge=0.1s, 200"
    assert lookup_call.headers["X-Sidecar-Attempts"] == "2"
    assert email_call.headers["X-Sidecar-Trail"] == "200"


# --- MCP over aiohttp: a JSON-RPC tool server that resets the first call of each tool ------

TOOL_LIST = {
    "tools": [
        {
            "name": "lookup",
            "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": True},
        },
        {
            "name": "charge",
            "inputSchema": {"type": "object"},
            "annotations": {"destructiveHint": True},
        },
    ]
}


async def dropped(request: web.Request) -> web.Response:
    """Read the request, then close the connection without an answer."""
    request.transport.close()
    return web.Response()


def resetting_mcp_server(runs: Counter[str]) -> Callable[[web.Request], Any]:
    """Answers ``tools/list``; a tool's first ``tools/call`` is read, then the connection drops."""

    async def handle(request: web.Request) -> web.StreamResponse:
        rpc = await request.json()
        if rpc["method"] == "tools/list":
            return web.json_response({"jsonrpc": "2.0", "id": rpc["id"], "result": TOOL_LIST})
        tool = rpc["params"]["name"]
        runs[tool] += 1
        if runs[tool] == 1:
            return await dropped(request)
        result = {"content": [{"type": "text", "text": f"{tool} ok"}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": rpc["id"], "result": result})

    return handle


def rpc(method: str, request_id: int, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


async def test_mcp_reset_replays_only_the_tool_annotated_safe_in_a_relayed_list(
    make_tool, make_sidecar
):
    runs: Counter[str] = Counter()
    tool = await make_tool(resetting_mcp_server(runs))
    sidecar = await make_sidecar(tool)

    listed = await sidecar.client.post("/mcp", json=rpc("tools/list", 1))
    assert (await listed.json())["result"] == TOOL_LIST

    looked_up = await sidecar.client.post("/mcp", json=rpc("tools/call", 2, {"name": "lookup"}))
    assert (await looked_up.json())["result"]["content"][0]["text"] == "lookup ok"
    assert runs["lookup"] == int(looked_up.headers["X-Sidecar-Attempts"]) == 2

    charged = await sidecar.client.post("/mcp", json=rpc("tools/call", 3, {"name": "charge"}))
    assert_maybe_delivered(charged.status, charged.headers, await charged.read(), "UPSTREAM_RESET")
    assert runs["charge"] == 1


async def test_mcp_annotations_the_sidecar_never_relayed_do_not_make_a_call_replayable(
    make_tool, make_sidecar
):
    """The agent listed the tools elsewhere; the sidecar knows nothing about ``lookup``."""
    runs: Counter[str] = Counter()
    tool = await make_tool(resetting_mcp_server(runs))
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post("/mcp", json=rpc("tools/call", 1, {"name": "lookup"}))

    assert_maybe_delivered(answer.status, answer.headers, await answer.read(), "UPSTREAM_RESET")
    assert runs["lookup"] == 1


async def test_sse_comment_line_is_not_the_first_event(make_tool, make_sidecar):
    """The MCP SDK's 2026-07-28 transport commits a call that stays silent to SSE with a
    ``: ping`` comment before any event; the decision waits for the first real event (here a
    retryable JSON-RPC error on a call the agent made safe to repeat with its own key)."""
    runs = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal runs
        runs += 1
        rpc_id = (await request.json())["id"]
        if runs == 1:
            message = {
                "jsonrpc": "2.0",
                "id": rpc_id,
                "error": {"code": -32603, "message": "busy", "data": {"retryable": True}},
            }
        else:
            message = {"jsonrpc": "2.0", "id": rpc_id, "result": {"content": [], "isError": False}}
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(b": ping\r\n\r\n")
        await asyncio.sleep(0.2)  # the tool's pacing: the comment travels on its own
        await stream.write(b"event: message\r\ndata: " + orjson.dumps(message) + b"\r\n\r\n")
        await stream.write_eof()
        return stream

    tool = await make_tool(handle)
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post(
        "/mcp", json=rpc("tools/call", 1, {"name": "lookup"}), headers={"Idempotency-Key": "k-1"}
    )

    assert b'"result"' in await answer.read()
    assert runs == int(answer.headers["X-Sidecar-Attempts"]) == 2
    assert answer.headers["X-Sidecar-Outcome"] == "recovered"


# --- FastAPI on uvicorn: a slow tool, POST vs PUT, and a slow body ------------------------


class Order(BaseModel):
    item: str
    quantity: int


def orders_app(runs: Counter[str]) -> FastAPI:
    app = FastAPI()

    @app.post("/orders")
    async def create_order(order: Order) -> dict[str, Any]:
        runs["POST"] += 1
        await asyncio.sleep(SLOW_S)
        return {"created": order.item}

    @app.put("/orders/{order_id}")
    async def replace_order(order_id: str, order: Order) -> dict[str, Any]:
        runs["PUT"] += 1
        if runs["PUT"] == 1:
            await asyncio.sleep(SLOW_S)
        return {"replaced": order_id}

    @app.post("/reports")
    async def build_report() -> StreamingResponse:
        runs["report"] += 1

        async def rows() -> AsyncIterator[bytes]:
            yield b'{"rows": ['
            await asyncio.sleep(SLOW_S)
            yield b"1, 2, 3]}"

        return StreamingResponse(rows(), media_type="application/json")

    return app


@asynccontextmanager
async def fastapi_behind_sidecar(
    runs: Counter[str], make_sidecar: Callable[..., Any]
) -> AsyncIterator[Sidecar]:
    async with uvicorn_serving(orders_app(runs)) as url:
        yield await make_sidecar(url, per_try_timeout_ms=PER_TRY_MS)


async def test_fastapi_slow_post_runs_once_and_the_agent_hears_maybe(make_sidecar):
    runs: Counter[str] = Counter()
    async with fastapi_behind_sidecar(runs, make_sidecar) as sidecar:
        answer = await sidecar.client.post("/orders", json={"item": "lamp", "quantity": 1})
        body = await answer.read()

    assert_maybe_delivered(answer.status, answer.headers, body, "UPSTREAM_TIMEOUT")
    assert runs["POST"] == 1


async def test_fastapi_slow_put_is_replayed_once_per_attempt_reported(make_sidecar):
    runs: Counter[str] = Counter()
    async with fastapi_behind_sidecar(runs, make_sidecar) as sidecar:
        answer = await sidecar.client.put("/orders/o-9", json={"item": "lamp", "quantity": 2})
        body = await answer.json()

    assert (answer.status, body) == (200, {"replaced": "o-9"})
    assert runs["PUT"] == int(answer.headers["X-Sidecar-Attempts"]) == 2
    assert answer.headers["X-Sidecar-Outcome"] == "recovered"


async def test_fastapi_head_in_time_with_slow_body_is_relayed_not_replayed(make_sidecar):
    """The head came within the per-try timeout; the body is slower than the inspection
    window. The answer goes to the agent as it is, whole, from the one run."""
    runs: Counter[str] = Counter()
    async with fastapi_behind_sidecar(runs, make_sidecar) as sidecar:
        answer = await sidecar.client.post("/reports", json={})
        body = await answer.read()

    assert (answer.status, orjson.loads(body)) == (200, {"rows": [1, 2, 3]})
    assert runs["report"] == 1
    assert answer.headers["X-Sidecar-Attempts"] == "1"


# --- aiohttp: no request reaches the tool that the sidecar does not count -------------------


@pytest.mark.parametrize("method", ["PUT", "GET", "DELETE"])
async def test_dropped_connections_reach_the_tool_once_per_attempt(make_tool, make_sidecar, method):
    tool = await make_tool(dropped)
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.request(method, "/items/7", data=b"{}")
    body = orjson.loads(await answer.read())

    assert (answer.status, body["error"]["code"]) == (502, "UPSTREAM_RESET")
    received = len(tool.seen)
    assert received == int(answer.headers["X-Sidecar-Attempts"]) == 4
    assert answer.headers["x-should-retry"] == "false"


# --- a POST that was delivered: who may say it is safe to send again ------------------------


def reset_then_ok() -> Callable[[web.Request], Any]:
    calls = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return await dropped(request) if calls == 1 else web.json_response({"charged": True})

    return handle


async def test_post_reset_after_write_without_an_agent_key_is_not_replayed(make_tool, make_sidecar):
    tool = await make_tool(reset_then_ok())
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post("/charges", json={"amount": 5})

    assert_maybe_delivered(answer.status, answer.headers, await answer.read(), "UPSTREAM_RESET")
    assert len(tool.seen) == 1
    # The sidecar's own key went along, but only a key the agent chose makes a replay safe.
    assert "Idempotency-Key" in tool.seen[0].headers


async def test_post_reset_after_write_with_an_agent_key_is_replayed(make_tool, make_sidecar):
    tool = await make_tool(reset_then_ok())
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post(
        "/charges", json={"amount": 5}, headers={"Idempotency-Key": "charge-42"}
    )

    assert (answer.status, await answer.json()) == (200, {"charged": True})
    assert len(tool.seen) == int(answer.headers["X-Sidecar-Attempts"]) == 2
    assert [seen.headers["Idempotency-Key"] for seen in tool.seen] == ["charge-42"] * 2
    assert answer.headers["X-Sidecar-Outcome"] == "recovered"
    assert "x-should-retry" not in answer.headers


async def test_post_reset_after_write_on_a_route_marked_idempotent_is_replayed(
    make_tool, make_sidecar, tmp_path
):
    tool = await make_tool(reset_then_ok())
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        f"routes:\n  - name: ledger\n    upstream: {tool.url}\n    idempotent: true\n"
    )
    sidecar = await make_sidecar(config_file=str(config))

    answer = await sidecar.client.post("/charges", json={"amount": 5})

    assert answer.status == 200
    assert len(tool.seen) == int(answer.headers["X-Sidecar-Attempts"]) == 2


async def test_replay_delivered_always_keeps_the_old_behaviour(make_tool, make_sidecar):
    tool = await make_tool(reset_then_ok())
    sidecar = await make_sidecar(tool, replay_delivered="always")

    answer = await sidecar.client.post("/charges", json={"amount": 5})

    assert answer.status == 200
    assert len(tool.seen) == int(answer.headers["X-Sidecar-Attempts"]) == 2


# --- the openai client: the sidecar tells it that it already retried ------------------------

RATE_LIMITED = {
    "error": {
        "message": "Rate limit reached",
        "type": "requests",
        "code": "rate_limit_exceeded",
    }
}


def rate_limited() -> web.Response:
    return web.json_response(RATE_LIMITED, status=429, headers={"Retry-After": "0"})


def openai_through(sidecar: Sidecar) -> openai.AsyncOpenAI:
    """The client as an agent builds it: its own default ``max_retries=2`` left on."""
    return openai.AsyncOpenAI(base_url=str(sidecar.client.make_url("/v1")), api_key="sk-test")


CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_openai_client_does_not_retry_what_the_sidecar_gave_up_on(make_tool, make_sidecar):
    tool = await make_tool(scripted(rate_limited))
    sidecar = await make_sidecar(tool)

    async with openai_through(sidecar) as client:
        assert client.max_retries == 2
        with pytest.raises(openai.RateLimitError) as raised:
            await client.chat.completions.create(**CHAT)

    received = len(tool.seen)
    assert received == 4  # SIDECAR_MAX_RETRIES=3: four attempts, and nothing on top
    headers = raised.value.response.headers
    assert headers["x-sidecar-attempts"] == "4"
    assert headers["x-should-retry"] == "false"


async def test_openai_client_keeps_the_tools_own_retry_header_on_a_recovered_answer(
    make_tool, make_sidecar
):
    def answered() -> web.Response:
        answer = completion("hello")
        answer.headers["x-should-retry"] = "true"
        return answer

    tool: Tool = await make_tool(scripted(rate_limited, answered))
    sidecar = await make_sidecar(tool)

    async with openai_through(sidecar) as client:
        raw = await client.chat.completions.with_raw_response.create(**CHAT)

    assert raw.parse().choices[0].message.content == "hello"
    assert len(tool.seen) == 2
    assert raw.headers["x-sidecar-outcome"] == "recovered"
    assert raw.headers["x-should-retry"] == "true"
