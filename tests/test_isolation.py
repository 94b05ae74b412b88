"""No single agent's input holds what other agents need: the in-flight slots (uploads that
trickle in), the memory (heads and bodies held), the event loop (a stall is seen). Each
test is its attack in small, and checks a healthy request to another route still gets its
answer, and the memory the sidecar counts stays within its budget."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from aiohttp import web
from structlog.testing import capture_logs

from tests.conftest import eventually

BUDGET = 256 * 1024


async def ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"success": True})


def two_routes(tool_url: str) -> list[dict[str, str]]:
    return [
        {"name": "upload", "prefix": "/upload", "upstream": tool_url},
        {"name": "probe", "prefix": "/probe", "upstream": tool_url},
    ]


@asynccontextmanager
async def open_connections(
    port: int, count: int, first_bytes: bytes
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """``count`` connections to the sidecar, each having sent ``first_bytes`` only."""
    held = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(first_bytes)
            await writer.drain()
            held.append((reader, writer))
        yield held
    finally:
        for _, writer in held:
            writer.close()


async def status_and_body(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await asyncio.wait_for(reader.readexactly(length), 5)
    return int(head.split(b" ", 2)[1]), head, body


async def test_uploads_that_trickle_in_hold_no_in_flight_slot(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(routes=two_routes(tool.url), max_in_flight=2)
    slow_head = b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 10

    async with open_connections(sidecar.client.port, 20, slow_head):
        await eventually(lambda: sidecar.metric("sidecar_in_flight_requests", route="upload") == 20)
        probes = [await sidecar.client.get("/probe/now") for _ in range(5)]

    assert [probe.status for probe in probes] == [200] * 5
    assert [seen.raw_path for seen in tool.seen] == ["/probe/now"] * 5


async def test_bodies_past_the_memory_budget_are_refused_and_others_still_served(
    make_tool, make_sidecar
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(routes=two_routes(tool.url), max_buffered_bytes=BUDGET)
    size = 100 * 1024  # two fit in the budget, the third does not
    head = b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size

    async with open_connections(sidecar.client.port, 2, head + b"{") as held:
        await eventually(lambda: sidecar.metric("sidecar_buffered_bytes") == 2 * size)
        async with open_connections(sidecar.client.port, 1, head + b"{" * size) as (third,):
            status, refused_head, refused = await status_and_body(third[0])
        probe = await sidecar.client.get("/probe/now")
        assert sidecar.metric("sidecar_buffered_bytes") <= BUDGET
        for _, writer in held:
            writer.write(b"{" * (size - 1))
        answers = [await status_and_body(reader) for reader, _ in held]

    assert status == 503
    assert b"Retry-After: 1\r\n" in refused_head
    assert orjson.loads(refused)["error"]["code"] == "SIDECAR_OVERLOADED"
    assert probe.status == 200
    assert [answer[0] for answer in answers] == [200, 200]
    assert sorted(seen.raw_path for seen in tool.seen) == ["/probe/now"] + ["/upload"] * 2
    await eventually(lambda: sidecar.metric("sidecar_buffered_bytes") == 0)
    assert (
        sidecar.metric(
            "sidecar_requests_total", route="upload", method="POST", outcome="overloaded"
        )
        == 1
    )


async def test_unfinished_heads_past_the_memory_budget_are_refused(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(routes=two_routes(tool.url), max_buffered_bytes=BUDGET)
    # 90 KB of header lines, each within its limit, and no end.
    unfinished = b"GET /upload HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: %s\r\n" % (b"a" * 30_000) * 3

    async with open_connections(sidecar.client.port, 2, unfinished):
        await eventually(lambda: sidecar.metric("sidecar_buffered_bytes") >= 2 * 90_000)
        async with open_connections(sidecar.client.port, 1, unfinished) as ((reader, _),):
            status, head, body = await status_and_body(reader)
        probe = await sidecar.client.get("/probe/now")
        assert sidecar.metric("sidecar_buffered_bytes") <= BUDGET

    assert status == 503
    assert b"Retry-After: 1\r\n" in head
    assert orjson.loads(body)["error"]["code"] == "SIDECAR_OVERLOADED"
    assert probe.status == 200
    assert [seen.raw_path for seen in tool.seen] == ["/probe/now"]
    await eventually(lambda: sidecar.metric("sidecar_buffered_bytes") == 0)


async def test_a_callback_that_holds_the_loop_is_measured_and_logged(make_tool, make_sidecar):
    async def blocking(_: web.Request) -> web.Response:
        time.sleep(0.5)  # noqa: ASYNC251  # the stall under test
        return web.json_response({"success": True})

    sidecar = await make_sidecar(await make_tool(blocking))

    with capture_logs() as logs:
        assert (await sidecar.client.get("/x")).status == 200
        await eventually(lambda: any(log["event"] == "event_loop_stalled" for log in logs))

    stalled = next(log for log in logs if log["event"] == "event_loop_stalled")
    assert stalled["lag_s"] > 0.25
    # The gauge holds the latest sample (the stall's is soon followed by a small one).
    assert sidecar.registry.get_sample_value("sidecar_event_loop_lag_seconds") is not None
