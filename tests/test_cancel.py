"""An agent that gives up stops the sidecar: an MCP ``notifications/cancelled`` for a request
ends its retries, and so does the agent's connection closing. Every test counts what the
tool received."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import anyio
import orjson
import pytest
from aiohttp import web
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from sidecar.retry.cancel import InFlight
from tests.asgi import uvicorn_serving
from tests.conftest import Tool, eventually, hang
from tests.wire import Wire, mcp_client, own_error

SESSION = {"Mcp-Session-Id": "session-1"}


def rpc(method: str, rpc_id: object = None, **params: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rpc_id is not None:
        message["id"] = rpc_id
    return orjson.dumps(message)


def cancel(rpc_id: object) -> bytes:
    return rpc("notifications/cancelled", requestId=rpc_id, reason="timed out")


CALL = rpc("tools/call", 7, name="search", arguments={"q": "x"})


@pytest.mark.parametrize(
    ("watched_headers", "watched_body", "cancel_headers", "cancel_body", "stops"),
    [
        (SESSION, CALL, SESSION, cancel(7), True),
        (SESSION, CALL, SESSION, cancel(8), False),  # another request
        (SESSION, CALL, SESSION, cancel("7"), False),  # "7" is not 7
        (SESSION, CALL, {"Mcp-Session-Id": "session-2"}, cancel(7), False),  # another agent's
        (SESSION, CALL, {}, cancel(7), False),  # no session: nobody's to cancel
        ({}, CALL, {}, cancel(7), False),  # without a session a request is not tracked
        (SESSION, rpc("tools/call", "a-7", name="s"), SESSION, cancel("a-7"), True),
        (SESSION, rpc("tools/call", True, name="s"), SESSION, cancel(True), False),
        (SESSION, CALL, SESSION, b'{"jsonrpc": "2.0", "method": "notifications/cancelled"}', False),
        (SESSION, b'{"q": 1}', SESSION, cancel(7), False),  # not JSON-RPC
    ],
)
def test_a_cancellation_stops_only_the_request_it_names_on_its_session(
    watched_headers, watched_body, cancel_headers, cancel_body, stops
):
    in_flight = InFlight()
    with in_flight.watch("mcp", watched_headers, watched_body) as stop:
        with in_flight.watch("mcp", cancel_headers, cancel_body) as none:
            assert none is None  # a notification itself is never stopped
        assert (stop is not None and stop.is_set()) is stops


def test_a_finished_request_is_forgotten_and_the_tracked_are_bounded():
    in_flight = InFlight(max_tracked=1)
    with in_flight.watch("mcp", SESSION, CALL) as first:
        assert first is not None
        with in_flight.watch("mcp", SESSION, rpc("tools/call", 8, name="s")) as second:
            assert second is None  # past the bound: not cancellable, still forwarded
    with in_flight.watch("mcp", SESSION, cancel(7)):
        pass
    assert not first.is_set()  # it had ended: a late cancellation finds nothing


def recording_tool_calls(seen: list[str]):
    """An MCP-ish tool: the first ``tools/call`` gets ``503`` with ``Retry-After: 2``, a
    later one would get a result; a notification gets ``202``."""

    async def handler(request: web.Request) -> web.Response:
        message = orjson.loads(await request.read())
        seen.append(message["method"])
        if "id" not in message:
            return web.Response(status=202)
        if seen.count("tools/call") == 1:
            return web.json_response({"error": "busy"}, status=503, headers={"Retry-After": "2"})
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": {}})

    return handler


def real_sleep_noting(waiting: asyncio.Event):
    async def sleep(seconds: float) -> None:
        waiting.set()
        await asyncio.sleep(seconds)

    return sleep


async def test_a_cancellation_cuts_the_wait_and_no_retry_follows(make_tool, make_sidecar):
    seen: list[str] = []
    waiting = asyncio.Event()
    tool: Tool = await make_tool(recording_tool_calls(seen))
    sidecar = await make_sidecar(tool, sleep=real_sleep_noting(waiting))

    call = asyncio.create_task(sidecar.client.post("/mcp", data=CALL, headers=SESSION))
    await asyncio.wait_for(waiting.wait(), 5)
    notified = await sidecar.client.post("/mcp", data=cancel(7), headers=SESSION)
    answered = await asyncio.wait_for(call, 1)  # long before the 2 s wait would end

    assert notified.status == 202  # relayed to the tool as before
    assert answered.status == 503  # the tool's last real answer
    assert answered.headers["X-Sidecar-Outcome"] == "deadline"
    assert answered.headers["X-Sidecar-Trail"].startswith("503 retry_after=2")
    assert answered.headers["X-Sidecar-Trail"].endswith("s, stop=cancelled")
    # The run has ended (the answer went back): no attempt can follow.
    assert seen == ["tools/call", "notifications/cancelled"]


async def test_a_cancellation_abandons_the_attempt_in_flight(make_tool, make_sidecar):
    """No answer yet: the agent gets ``UPSTREAM_TIMEOUT`` (as a JSON-RPC error for the call,
    which is one), reason ``cancelled``."""
    seen: list[str] = []
    at_tool = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        message = orjson.loads(await request.read())
        seen.append(message["method"])
        if "id" not in message:
            return web.Response(status=202)
        at_tool.set()
        await hang()

    sidecar = await make_sidecar(await make_tool(slow))

    call = asyncio.create_task(sidecar.client.post("/mcp", data=CALL, headers=SESSION))
    await asyncio.wait_for(at_tool.wait(), 5)
    await sidecar.client.post("/mcp", data=cancel(7), headers=SESSION)
    answered = await asyncio.wait_for(call, 1)
    error = own_error(answered.status, await answered.read())

    assert (error.status, error.code) == (504, "UPSTREAM_TIMEOUT")
    assert error.details["reason"] == "cancelled"
    assert answered.headers["X-Sidecar-Trail"] == "stop=cancelled"
    assert seen == ["tools/call", "notifications/cancelled"]


async def test_an_agent_that_disconnects_during_a_wait_stops_the_retries(make_tool, make_sidecar):
    """A raw socket closes while the sidecar waits the 2 s the tool asked for."""
    seen: list[str] = []
    waiting = asyncio.Event()
    tool = await make_tool(recording_tool_calls(seen))
    sidecar = await make_sidecar(tool, sleep=real_sleep_noting(waiting))
    server = sidecar.client.server

    _reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /mcp HTTP/1.1\r\nHost: tool\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(CALL), CALL)
    )
    await writer.drain()
    await asyncio.wait_for(waiting.wait(), 5)
    writer.close()
    await writer.wait_closed()
    # The request is finished once it is no longer in flight: no attempt can follow.
    await eventually(lambda: sidecar.metric("sidecar_in_flight_requests", route="default") == 0)

    assert seen == ["tools/call"]
    # The agent's deadline, not a verdict on the tool.
    await eventually(lambda: cancelled_calls(sidecar) == 1)
    assert not_retryable_calls(sidecar) == 0


def cancelled_calls(sidecar: Any) -> float:
    return sidecar.metric(
        "sidecar_requests_total", route="default", method="POST", outcome="deadline"
    )


def not_retryable_calls(sidecar: Any) -> float:
    return sidecar.metric(
        "sidecar_requests_total", route="default", method="POST", outcome="not-retryable"
    )


async def test_the_mcp_sdks_own_cancellation_stops_a_replay(make_sidecar):
    """The MCP SDK's client gives up after 1 s and sends ``notifications/cancelled``. The
    read-only tool takes 3 s and answers nothing before (``json_response``), so a 1.5 s
    per-try timeout would replay it: the cancellation stops that, and it runs once."""
    runs: Counter[str] = Counter()
    server = MCPServer("field")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def lookup(key: str) -> str:
        runs["lookup"] += 1
        await anyio.sleep(3)
        return f"found {key}"

    app = server.streamable_http_app(json_response=True)
    async with uvicorn_serving(app) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=1500)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            await client.list_tools()  # the sidecar learns that lookup is read-only
            with pytest.raises((MCPError, TimeoutError)):
                await client.call_tool("lookup", {"key": "k"}, read_timeout_seconds=1)
            # The call's request has ended (the session's GET stream stays in flight).
            await eventually(lambda: cancelled_calls(sidecar) == 1)
            # The SDK still hands the call's late answer to its session; a round trip after
            # it arrived lets that finish before the client closes its streams.
            await eventually(lambda: len(wire.tool_calls()) == 1)
            await client.list_tools()

    assert runs["lookup"] == 1
    assert "notifications/cancelled" in [exchange.rpc_method for exchange in wire.exchanges]
