"""Streams go through as they arrive, live as long as the session, and end with the agent."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from tests.conftest import eventually


def sse_tool(events: int, interval_s: float, ended: asyncio.Event | None = None):
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for number in range(events):
                await response.write(f"data: {number}\n\n".encode())
                await asyncio.sleep(interval_s)
        except (ConnectionResetError, asyncio.CancelledError):
            if ended is not None:
                ended.set()
            raise
        await response.write_eof()
        return response

    return stream


async def test_event_stream_chunks_reach_the_agent_as_they_are_sent(make_tool, make_sidecar):
    sidecar = await make_sidecar(await make_tool(sse_tool(events=3, interval_s=0.3)))

    response = await sidecar.client.get("/mcp", headers={"Accept": "text/event-stream"})
    started = time.monotonic()
    first = await response.content.readuntil(b"\n\n")
    first_after = time.monotonic() - started

    assert response.headers["Content-Type"] == "text/event-stream"
    assert first == b"data: 0\n\n"
    assert first_after < 0.25, "the first event waited for the rest of the stream"
    assert await response.content.read() == b"data: 1\n\ndata: 2\n\n"


async def test_long_lived_stream_outlives_the_request_deadline(make_tool, make_sidecar):
    sidecar = await make_sidecar(
        await make_tool(sse_tool(events=6, interval_s=0.1)),
        per_try_timeout_ms=150,
        request_timeout_ms=200,
    )

    response = await sidecar.client.get("/mcp")

    assert await response.read() == b"".join(f"data: {n}\n\n".encode() for n in range(6))


async def test_agent_leaving_mid_stream_ends_the_upstream_request_quietly(
    make_tool, make_sidecar, caplog: pytest.LogCaptureFixture
):
    upstream_ended = asyncio.Event()
    sidecar = await make_sidecar(
        await make_tool(sse_tool(events=100, interval_s=0.05, ended=upstream_ended))
    )

    with capture_logs() as logs, caplog.at_level(logging.WARNING):
        response = await sidecar.client.get("/mcp")
        assert await response.content.readuntil(b"\n\n") == b"data: 0\n\n"
        response.close()
        await asyncio.wait_for(upstream_ended.wait(), timeout=2)
        # Logged, if at all, before the request stops being in flight.
        await eventually(lambda: sidecar.metric("sidecar_in_flight_requests", route="default") == 0)

    assert not [entry for entry in logs if entry["log_level"] in ("warning", "error", "critical")]
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
