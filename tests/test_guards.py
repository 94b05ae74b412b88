"""Guards that protect a tool without starving recovery: circuit, overload, slow clients."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from tests.conftest import scripted, unused_port


async def test_a_dead_tool_is_left_alone_after_a_few_calls(make_sidecar):
    """50 calls, 10 at a time, to a port where nothing listens, with the shipped defaults:
    the circuit opens after a handful of failed calls and the rest are answered at once."""
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}")
    semaphore = asyncio.Semaphore(10)

    async def call() -> tuple[str, int]:
        async with semaphore:
            response = await sidecar.client.post("/", json={})
            body = await response.json()
            return body["error"]["code"], int(response.headers["X-Sidecar-Attempts"])

    results = await asyncio.gather(*(call() for _ in range(50)))

    attempts = sum(count for _, count in results)
    codes = [code for code, _ in results]
    assert attempts / len(results) < 2  # an Envoy retry policy of 3 retries gives 4
    assert codes.count("CIRCUIT_OPEN") >= 30
    assert set(codes) == {"CIRCUIT_OPEN", "UPSTREAM_UNREACHABLE"}


async def test_a_steady_share_of_faulty_answers_never_opens_the_circuit(make_tool, make_sidecar):
    """One attempt in seven fails on a busy route: every call recovers, none is refused."""
    attempt_numbers = itertools.count(1)

    async def flaky(request: web.Request) -> web.Response:
        if next(attempt_numbers) % 7 == 0:
            return web.json_response({}, status=503)
        return web.json_response({"success": True})

    sidecar = await make_sidecar(await make_tool(flaky))
    semaphore = asyncio.Semaphore(20)

    async def call(path: str) -> int:
        async with semaphore:
            response = await sidecar.client.get(path)
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(call(f"/p{n % 2}") for n in range(300)))

    assert statuses == [200] * 300
    for tool in ("/p0", "/p1"):
        assert (
            sidecar.registry.get_sample_value(
                "sidecar_circuit_state", {"route": "default", "tool": tool}
            )
            == 0
        )


async def test_a_tool_that_retries_recover_is_never_refused_after_an_early_burst(
    make_tool, make_sidecar
):
    """The shipped circuit: an agent's first five calls each fail all four attempts (a
    burst of 20 failed attempts, 5 failed calls of 6), then the tool fails every other
    attempt and each call recovers on its retry. No call is ever refused: five failed
    calls are too few to judge a rate by, and a recovered call is a success."""
    attempts = itertools.count(1)

    async def flaky(request: web.Request) -> web.Response:
        attempt = next(attempts)
        if attempt <= 20 or attempt % 2:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"success": True})

    sidecar = await make_sidecar(await make_tool(flaky))
    outcomes = []
    for _ in range(60):
        response = await sidecar.client.post("/", json={"q": 1})
        await response.read()
        outcomes.append(response.headers["X-Sidecar-Outcome"])

    assert outcomes[:5] == ["exhausted"] * 5
    assert outcomes[5:] == ["recovered"] * 55
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="/") == 0


async def test_concurrent_waits_the_tool_asked_for_do_not_end_together(make_tool, make_sidecar):
    answers: dict[str, int] = {}

    async def rate_limited_once(request: web.Request) -> web.Response:
        call = request.headers["X-Call"]
        answers[call] = answers.get(call, 0) + 1
        if answers[call] == 1:
            return web.json_response({}, status=429, headers={"Retry-After": "1"})
        return web.json_response({})

    sidecar = await make_sidecar(await make_tool(rate_limited_once))

    await asyncio.gather(*(sidecar.client.get("/", headers={"X-Call": str(n)}) for n in range(10)))

    waits = sidecar.sleep.waits
    assert len(waits) == 10
    assert all(1.0 <= wait <= 1.25 for wait in waits)
    assert len(set(waits)) == 10


async def test_past_max_in_flight_the_sidecar_refuses_with_its_own_envelope(
    make_tool, make_sidecar
):
    arrived = asyncio.Event()
    release = asyncio.Event()
    held = 0

    async def holding(request: web.Request) -> web.Response:
        nonlocal held
        held += 1
        if held == 2:
            arrived.set()
        await release.wait()
        return web.json_response({})

    tool = await make_tool(holding)
    sidecar = await make_sidecar(tool, max_in_flight=2)
    first = [asyncio.create_task(sidecar.client.get("/")) for _ in range(2)]
    await asyncio.wait_for(arrived.wait(), timeout=5)

    with capture_logs() as logs:
        refused = await sidecar.client.get("/")
    release.set()
    admitted = await asyncio.gather(*first)

    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    refusal = (await refused.json())["error"]
    assert refusal["code"] == "SIDECAR_OVERLOADED"
    # Worth sending again shortly, in the body as in the headers.
    assert refusal["retryable"] is True and "x-should-retry" not in refused.headers
    assert [response.status for response in admitted] == [200, 200]
    assert len(tool.seen) == 2
    assert (
        sidecar.metric(
            "sidecar_requests_total", route="default", method="GET", outcome="overloaded"
        )
        == 1
    )
    assert any(log["event"] == "sidecar_overloaded" for log in logs)


async def test_a_full_connection_pool_is_the_sidecars_overload_not_the_tools_failure(
    make_tool, make_sidecar
):
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.json_response({})

    sidecar = await make_sidecar(
        await make_tool(slow), upstream_max_connections=1, per_try_timeout_ms=200
    )
    holder = asyncio.create_task(sidecar.client.get("/"))
    await asyncio.wait_for(arrived.wait(), timeout=5)

    waiting = await sidecar.client.get("/")
    release.set()
    await holder

    assert waiting.status == 503
    assert (await waiting.json())["error"]["code"] == "SIDECAR_OVERLOADED"
    assert waiting.headers["X-Sidecar-Trail"] == "pool_timeout"
    assert waiting.headers["X-Sidecar-Outcome"] == "overloaded"
    assert (
        sidecar.registry.get_sample_value(
            "sidecar_circuit_state", {"route": "default", "tool": "/"}
        )
        == 0
    )


async def open_agent(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def test_a_body_that_stops_arriving_gets_408_and_a_closed_connection(make_tool, make_sidecar):
    tool = await make_tool(scripted(lambda: web.json_response({})))
    sidecar = await make_sidecar(tool, client_timeout_ms=300)
    reader, writer = await open_agent(sidecar.client.port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\nabc")
    await writer.drain()

    answer = await asyncio.wait_for(reader.read(), timeout=5)  # read() returns at EOF
    writer.close()

    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"CLIENT_TIMEOUT"' in answer
    assert tool.seen == []


async def test_a_request_head_that_never_ends_gets_its_connection_closed(make_tool, make_sidecar):
    sidecar = await make_sidecar(
        await make_tool(scripted(lambda: web.json_response({}))), client_timeout_ms=300
    )
    reader, writer = await open_agent(sidecar.client.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    await writer.drain()

    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    writer.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
async def test_a_stalled_upload_never_reaches_the_tool_as_a_whole_body(
    make_tool, make_sidecar, streamed
):
    received: list[bytes] = []

    async def reading(request: web.Request) -> web.Response:
        with contextlib.suppress(Exception):
            received.append(await request.read())
        return web.json_response({})

    tool = await make_tool(reading)
    sidecar = await make_sidecar(
        tool, client_timeout_ms=300, max_body_bytes=4 if streamed else 1024
    )
    reader, writer = await open_agent(sidecar.client.port)
    writer.write(b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    await writer.drain()

    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()

    assert answer.startswith(b"HTTP/1.1 408 ")
    assert all(len(body) < 100 for body in received)
