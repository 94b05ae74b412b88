"""MCP answers streamed as a resumable server streams them: a priming event first (an ``id``
and an empty ``data``, MCP 2025-11-25), then the server's notifications, then the answer.

The tool is the MCP SDK's own streamable-HTTP server with an event store, on uvicorn, behind
a counting tap (an aiohttp proxy that can drop a call's connection after the server ran it);
the agent is the SDK's client, speaking 2025-11-25 (``mode="legacy"``), through the sidecar.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http import EventCallback, EventStore
from mcp.types import JSONRPCMessage, ToolAnnotations

from tests.asgi import uvicorn_serving
from tests.conftest import Tool, hang
from tests.mcp_relay import answer_head, asked, relay_rest
from tests.wire import Wire, mcp_client, orders_failing_once, own_error

# What crosses between the agent and the server through the tap, besides the body.


class MemoryEventStore(EventStore):
    """Resumability as the SDK asks for it; with a store, every POST stream is primed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(next(self._ids))
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> None:
        return None  # no client here reconnects


def tap(server_url: str, session: aiohttp.ClientSession, drop_first: frozenset[str]) -> Any:
    """Relays every request to the MCP server as it streams; the first ``tools/call`` of a tool
    in ``drop_first``, or the first request of a method in it, is sent, its whole answer read
    (the server ran it), and the agent's connection closed without a byte of it: a reset
    after delivery."""
    dropped: set[str] = set()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = asked(request)
        sent = orjson.loads(body) if body else None
        tool = sent.get("params", {}).get("name") if isinstance(sent, dict) else None
        called = tool if tool is not None or not isinstance(sent, dict) else sent.get("method")
        async with session.request(
            request.method, server_url + request.path_qs, data=body, headers=headers
        ) as answer:
            if called in drop_first and called not in dropped:
                dropped.add(called)
                await answer.read()
                request.transport.close()
                return web.Response()
            relayed = await answer_head(request, answer)
            return await relay_rest(relayed, answer)

    return relay


@asynccontextmanager
async def primed_mcp_agent(
    server: MCPServer,
    make_tool: Callable[..., Any],
    make_sidecar: Callable[..., Any],
    drop_first: frozenset[str] = frozenset(),
    **settings: Any,
) -> AsyncIterator[tuple[Client, Wire, Tool]]:
    app = server.streamable_http_app(event_store=MemoryEventStore())
    async with uvicorn_serving(app) as url, aiohttp.ClientSession(auto_decompress=False) as http:
        tool = await make_tool(tap(url, http, drop_first))
        sidecar = await make_sidecar(tool, **settings)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            yield client, wire, tool


def listed(wire: Wire) -> list[Any]:
    return [exchange for exchange in wire.exchanges if exchange.rpc_method == "tools/list"]


async def test_a_reset_after_delivery_is_replayed_for_a_tool_a_streamed_list_marked_idempotent(
    make_tool, make_sidecar
):
    """The annotations come in a primed event stream; ``lookup`` (``idempotentHint``) is sent
    again after the reset, ``charge`` (no annotation) is not."""
    runs: Counter[str] = Counter()
    server = MCPServer("primed")

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def lookup(key: str) -> str:
        runs["lookup"] += 1
        return f"lookup run {runs['lookup']}"

    @server.tool()
    async def charge(amount: int) -> str:
        runs["charge"] += 1
        return f"charged {amount}"

    drop_first = frozenset({"lookup", "charge"})
    async with primed_mcp_agent(server, make_tool, make_sidecar, drop_first) as (
        client,
        wire,
        _,
    ):
        await client.list_tools()
        looked_up = await client.call_tool("lookup", {"key": "k"})
        with pytest.raises(MCPError):
            await client.call_tool("charge", {"amount": 5})

    [tools_list] = listed(wire)
    assert tools_list.headers["content-type"].startswith("text/event-stream")
    assert looked_up.content[0].text == "lookup run 2"
    assert runs == {"lookup": 2, "charge": 1}
    lookup_call, charge_call = wire.tool_calls()
    assert lookup_call.headers["X-Sidecar-Attempts"] == "2"
    assert lookup_call.headers["X-Sidecar-Outcome"] == "recovered"
    refused = own_error(charge_call.status, charge_call.body)
    assert (refused.status, refused.code) == (502, "UPSTREAM_RESET")
    assert charge_call.headers["X-Sidecar-Attempts"] == "1"


async def test_a_session_s_set_up_reset_after_delivery_is_replayed(make_tool, make_sidecar):
    """``initialize`` and ``tools/list`` each lose their answer once after the server ran
    them: both are MCP's own requests, safe to run twice, so the agent's session starts and
    lists its tools as if nothing happened (the server ran each twice)."""
    server = MCPServer("primed")

    @server.tool()
    async def charge(amount: int) -> str:
        return f"charged {amount}"

    drop_first = frozenset({"initialize", "tools/list"})
    async with primed_mcp_agent(server, make_tool, make_sidecar, drop_first) as (
        client,
        wire,
        _,
    ):
        listed_tools = await client.list_tools()

    assert [tool.name for tool in listed_tools.tools] == ["charge"]
    [tools_list] = listed(wire)
    assert tools_list.headers["X-Sidecar-Attempts"] == "2"
    assert tools_list.headers["X-Sidecar-Outcome"] == "recovered"
    [initialize] = [e for e in wire.exchanges if e.rpc_method == "initialize"]
    assert initialize.headers["X-Sidecar-Trail"].startswith("reset ")


async def test_a_streamed_json_rpc_error_is_retried_only_when_the_server_says_retryable(
    make_tool, make_sidecar
):
    """In the event after the priming one: ``place_order``'s ``-32603`` says
    ``data.retryable: true`` (the server's word that the call took no effect), so it is
    sent again and recovers though the tool has no annotation; ``cancel_order``'s says
    nothing, so it is not, read-only as it is."""
    server, runs = orders_failing_once("primed")

    async with primed_mcp_agent(server, make_tool, make_sidecar) as (client, wire, _):
        await client.list_tools()
        placed = await client.call_tool("place_order", {"symbol": "ACME"})
        with pytest.raises(MCPError) as refused:
            await client.call_tool("cancel_order", {"symbol": "ACME"})

    assert placed.content[0].text == "place_order run 2"
    assert refused.value.code == -32603
    assert runs == {"place_order": 2, "cancel_order": 1}
    place_call, cancel_call = wire.tool_calls()
    assert place_call.headers["content-type"].startswith("text/event-stream")
    assert place_call.headers["X-Sidecar-Trail"].startswith("200 backoff=")
    assert place_call.headers["X-Sidecar-Outcome"] == "recovered"
    assert (
        cancel_call.headers["X-Sidecar-Attempts"],
        cancel_call.headers["X-Sidecar-Outcome"],
    ) == (
        "1",
        "not-retryable",
    )


async def test_a_streamed_is_error_result_is_judged_not_reported_ok(make_tool, make_sidecar):
    """A tool that raised: its ``isError`` result, after the priming event, is a failed call
    (as the same result in a JSON answer is), not ``ok``; it runs once."""
    runs: Counter[str] = Counter()
    server = MCPServer("primed")

    @server.tool()
    async def capture(order: str) -> str:
        runs["capture"] += 1
        raise RuntimeError("card declined after the hold was placed")

    async with primed_mcp_agent(server, make_tool, make_sidecar) as (client, wire, _):
        captured = await client.call_tool("capture", {"order": "o-1"})

    assert captured.is_error
    assert runs["capture"] == 1
    [call] = wire.tool_calls()
    assert call.headers["content-type"].startswith("text/event-stream")
    assert call.headers["X-Sidecar-Outcome"] == "not-retryable"


async def test_an_answer_slower_than_the_inspection_window_is_relayed_and_runs_once(
    make_tool, make_sidecar
):
    """The priming event comes at once, the answer after the inspection window: the stream
    goes to the agent as it is, and the call is not sent again."""
    runs: Counter[str] = Counter()
    server = MCPServer("primed")

    @server.tool()
    async def settle(invoice: str) -> str:
        runs["settle"] += 1
        await asyncio.sleep(0.5)
        return f"settled {invoice}"

    async with primed_mcp_agent(server, make_tool, make_sidecar, inspect_timeout_ms=200) as (
        client,
        wire,
        _,
    ):
        settled = await client.call_tool("settle", {"invoice": "inv-7"})

    assert settled.content[0].text == "settled inv-7"
    assert runs["settle"] == 1
    [call] = wire.tool_calls()
    assert call.headers["content-type"].startswith("text/event-stream")
    assert call.headers["X-Sidecar-Attempts"] == "1"


# --- the stream as the agent gets it: every byte, in order --------------------------------

ERROR = {"code": -32603, "message": "busy", "data": {"retryable": True}}
STREAM = [
    b": ping\r",  # a comment, its CRLF cut between two writes
    b"\n\r\nid: 41\r\ndata: \r\n\r\n",  # the priming event
    b'event: message\rdata: {"jsonrpc":"2.0","method":"notifications/progress",',
    b'\rdata: "params":{"progressToken":1,"progress":0.5}}\r\r',  # a notification over 2 lines
    b'data: {"jsonrpc":"2.0","id":"call-9","error":' + orjson.dumps(ERROR) + b"}\n",
    b"\nid: 43\n: after the answer\n\n",  # bytes past the answer, in the same write
]


def streaming(runs: Counter[str], chunks: list[bytes]) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        runs["calls"] += 1
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for chunk in chunks:
            await answer.write(chunk)
            await asyncio.sleep(0.01)  # the tool's pacing: each write its own TCP segment
        await answer.write_eof()
        return answer

    return handle


CALL = {"jsonrpc": "2.0", "id": "call-9", "method": "tools/call", "params": {"name": "lookup"}}


async def test_the_agent_gets_the_whole_stream_byte_for_byte_after_the_answer_decided(
    make_tool, make_sidecar
):
    """The decision read up to the answer (a retryable error, sent again since the agent
    made the call safe with its key), past a comment and the priming event; the agent gets
    the last attempt's stream as it came: the bytes read for the decision, then the rest."""
    runs: Counter[str] = Counter()
    stream = STREAM[:2] + STREAM[4:]  # no notification before the answer
    tool = await make_tool(streaming(runs, stream))
    sidecar = await make_sidecar(tool, max_retries=1)

    answer = await sidecar.client.post("/mcp", json=CALL, headers={"Idempotency-Key": "k-9"})

    assert await answer.read() == b"".join(stream)
    assert runs["calls"] == int(answer.headers["X-Sidecar-Attempts"]) == 2
    assert answer.headers["X-Sidecar-Outcome"] == "exhausted"


async def test_a_notification_before_the_answer_passes_the_stream_on_at_once(
    make_tool, make_sidecar
):
    """A progress notification shows the call alive: its stream goes to the agent as it
    comes, byte for byte, and is not sent again for the error that follows."""
    runs: Counter[str] = Counter()
    tool = await make_tool(streaming(runs, STREAM))
    sidecar = await make_sidecar(tool, max_retries=1)

    answer = await sidecar.client.post("/mcp", json=CALL, headers={"Idempotency-Key": "k-9"})

    assert await answer.read() == b"".join(STREAM)
    assert runs["calls"] == int(answer.headers["X-Sidecar-Attempts"]) == 1
    assert answer.headers["X-Sidecar-Outcome"] == "ok"


async def test_an_answer_past_the_inspect_limit_is_relayed_and_judged_by_its_status(
    make_tool, make_sidecar
):
    """256 KiB of notifications before the answer: the decision does not guess from them;
    the stream goes to the agent whole and the call, a 200, counts as answered."""
    runs: Counter[str] = Counter()
    notification = b'data: {"jsonrpc":"2.0","method":"notifications/message","params":{}}\n\n'
    chunks = [notification * 400] * 10 + STREAM[4:]
    tool = await make_tool(streaming(runs, chunks))
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post("/mcp", json=CALL, headers={"Idempotency-Key": "k-9"})

    assert await answer.read() == b"".join(chunks)
    assert runs["calls"] == 1
    assert answer.headers["X-Sidecar-Outcome"] == "ok"


async def test_a_stream_the_sidecar_resumed_ends_with_its_answer(make_tool, make_sidecar):
    """The call's stream breaks after its priming event; the server replays the answer on
    the sidecar's ``GET`` and keeps that stream open, as the TypeScript SDK's server does.
    The agent's stream ends with the answer, as the call's own would have, rather than at
    the drain."""
    resumed_after: list[str] = []

    async def resumable(request: web.Request) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        if request.method == "POST":
            await stream.write(b"id: 1\ndata: \n\n")
            assert request.transport is not None
            request.transport.close()  # broken after an event with an id
            return stream
        resumed_after.append(request.headers["Last-Event-ID"])
        await stream.write(b'id: 2\ndata: {"jsonrpc":"2.0","id":"call-9","result":{}}\n\n')
        await hang()

    sidecar = await make_sidecar(await make_tool(resumable))
    answer = await sidecar.client.post("/mcp", json=CALL)
    async with asyncio.timeout(5):
        body = await answer.read()

    assert body == b'id: 1\ndata: \n\nid: 2\ndata: {"jsonrpc":"2.0","id":"call-9","result":{}}\n\n'
    assert answer.headers["X-Sidecar-Trail"] == "200 resumed"
    assert resumed_after == ["1"]
