"""Shutdown and long-lived streams: an idle event stream ends after its last whole event, and
the process exits when the calls in flight are done, not when the streams are."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from aiohttp import web

from sidecar.serve.app import PROXY
from sidecar.tool.eventstream import EventScanner, is_event_stream
from tests.conftest import hang
from tests.processes import sidecar_process


@pytest.mark.parametrize(
    ("chunks", "at_boundary"),
    [
        ([], True),  # nothing relayed: the head alone is a whole stream
        ([b"data: 1\n\n"], True),
        ([b"data: 1\n"], False),  # the event's blank line has not come
        ([b"data: 1\n", b"\n"], True),
        ([b"data: 1\r\n\r\n"], True),
        ([b"data: 1\r\n", b"\r\n"], True),
        ([b"data: 1\r", b"\n"], False),  # CR then LF is one line break, not two
        ([b"data: 1\r", b"\n", b"\r\n"], True),
        ([b"data: 1\r\r"], True),  # CR alone ends a line too
        ([b"data: 1\n\ndata: 2"], False),  # a second event begun
        ([b"data: 1\n\n", b"data: 2\n"], False),
        ([b": keep-alive\n\n"], True),  # a comment line, blank-line ended
        ([b"id: 4\ndata:\n\n", b"event: message\ndata: {}\n\n"], True),
        ([b"data: 1\n", b"", b"\n"], True),
    ],
)
def test_where_an_event_stream_may_end(chunks, at_boundary):
    scanner = EventScanner(keep_data=False)
    for chunk in chunks:
        scanner.feed(chunk)
    assert scanner.at_boundary is at_boundary


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/event-stream", True),
        ("Text/Event-Stream; charset=utf-8", True),
        ("application/json", False),
        (None, False),
        ("text/event-streams", False),
    ],
)
def test_what_is_an_event_stream(content_type, expected):
    assert is_event_stream(content_type) is expected


async def test_an_idle_event_stream_ends_cleanly_at_drain_while_a_slow_call_finishes(
    aiohttp_server,
):
    """An MCP-like tool: a ``GET`` event stream that sent one event and then idles, and a
    ``POST`` that takes 1.5 s. SIGTERM: the stream ends at once after its event, with the
    terminating chunk; the call completes; the process exits well before the 20 s drain."""
    call_reached = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(b"id: 1\ndata: {}\n\n")
        await hang()  # idle, as a session's stream is between server messages

    async def slow(request: web.Request) -> web.Response:
        call_reached.set()
        await asyncio.sleep(1.5)
        return web.json_response({"success": True})

    app = web.Application()
    app.router.add_get("/mcp", events)
    app.router.add_post("/mcp", slow)
    tool = await aiohttp_server(app)
    async with sidecar_process(str(tool.make_url("/"))) as sidecar:
        exit_code = asyncio.create_task(sidecar.read_lines_until_exit())
        async with aiohttp.ClientSession() as agent:
            stream = await agent.get(f"{sidecar.proxy}/mcp")
            first = await stream.content.readuntil(b"\n\n")
            call = asyncio.create_task(agent.post(f"{sidecar.proxy}/mcp", json={}))
            await asyncio.wait_for(call_reached.wait(), 5)
            loop = asyncio.get_running_loop()
            signalled = loop.time()
            sidecar.process.send_signal(signal.SIGTERM)

            # The rest of the body, read to its end: a cut chunked body would raise here.
            rest = await asyncio.wait_for(stream.read(), 5)
            stream_ended_after = loop.time() - signalled
            answered = await asyncio.wait_for(call, 5)
            assert await asyncio.wait_for(exit_code, 10) == 0
            exited_after = loop.time() - signalled

    assert (first, rest) == (b"id: 1\ndata: {}\n\n", b"")
    assert stream.headers["Transfer-Encoding"] == "chunked"
    assert stream_ended_after < 1.0
    assert answered.status == 200
    assert await answered.json() == {"success": True}
    # The slow call's 1.5 s and the process's own stop, nowhere near the 20 s drain.
    assert exited_after < 3.5


async def test_a_stream_in_the_middle_of_an_event_at_drain_ends_after_that_event(
    make_tool, make_sidecar
):
    """The drain begins while half an event has been relayed: the relay waits for the
    event's end, then ends the stream; the tool's next event is not relayed."""
    go, never = asyncio.Event(), asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(b"data: 1\n")
        await go.wait()
        await stream.write(b"\n")
        await never.wait()
        return stream

    sidecar = await make_sidecar(await make_tool(events))
    stream = await sidecar.client.get("/events")
    assert await stream.content.readuntil(b"\n") == b"data: 1\n"
    draining = asyncio.create_task(sidecar.app[PROXY].drain(5))
    await asyncio.sleep(0)  # one turn of the loop: the drain has begun, and waits
    assert not draining.done()
    go.set()
    rest = await asyncio.wait_for(stream.read(), 5)
    await asyncio.wait_for(draining, 5)

    assert rest == b"\n"


async def test_at_drain_a_listen_stream_ends_and_a_call_still_owed_its_answer_finishes(
    make_tool, make_sidecar
):
    """MCP 2026-07-28: a ``subscriptions/listen`` stream outlives its request, as a 2025
    ``GET`` stream does, and ends after its acknowledgment once the drain begins; a call's
    stream that showed progress and still owes its answer is let finish."""
    answer_now = asyncio.Event()
    ack = b'data: {"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged"}\n\n'
    progress = b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n'
    result = b'data: {"jsonrpc":"2.0","id":2,"result":{}}\n\n'

    async def mcp(request: web.Request) -> web.StreamResponse:
        method = (await request.json())["method"]
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(ack if method == "subscriptions/listen" else progress)
        await answer_now.wait()
        await stream.write(b"" if method == "subscriptions/listen" else result)
        await hang()  # neither ends its stream by itself

    sidecar = await make_sidecar(await make_tool(mcp))
    listen = await sidecar.client.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen"}
    )
    call = await sidecar.client.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
    )
    assert await listen.content.readuntil(b"\n\n") == ack
    assert await call.content.readuntil(b"\n\n") == progress
    draining = asyncio.create_task(sidecar.app[PROXY].drain(30))

    assert await asyncio.wait_for(listen.read(), 5) == b""  # ended, with its last chunk
    assert not draining.done()  # the call still waits for its answer
    answer_now.set()
    assert await asyncio.wait_for(call.content.readuntil(b"\n\n"), 5) == result
    assert await asyncio.wait_for(call.read(), 5) == b""  # answered: it ends with the drain
    await asyncio.wait_for(draining, 5)
