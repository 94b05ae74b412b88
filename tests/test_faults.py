"""The fault matrix: every way a tool, a model or an agent can misbehave, over real sockets.

For each fault: the answer the agent gets, a bound on the time it takes, and no task or
socket left behind (the scenario is repeated and nothing may grow with the repetitions).
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import eventually, hang, scripted, unused_port
from tests.rawhttp import raw_tool, read_request_head, reply_then

pytestmark = pytest.mark.fault


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def assert_no_leaks(scenario: Callable[[], Awaitable[None]], repeats: int = 15) -> None:
    """Run ``scenario`` once to warm pools up, then ``repeats`` times: nothing may pile up.

    Tasks and sockets of the last runs may still be closing, so the counts are waited for;
    a leak keeps them up for good.
    """
    await scenario()
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    for _ in range(repeats):
        await scenario()

    def settled() -> bool:
        return len(asyncio.all_tasks()) <= tasks_before + 2 and open_fds() <= fds_before + 4

    await eventually(settled)


async def stall_until_closed(reader: asyncio.StreamReader) -> None:
    """Send nothing more, until the sidecar gives up and closes the connection."""
    await asyncio.wait_for(reader.read(), timeout=10)


RESET_MID_BODY = (
    b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
    b'{"success": false, "error": {"code": "BU'
)
HEADERS_THEN_STALL = (
    b"HTTP/1.1 500 Oops\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n"
)
TRUNCATED_CHUNKED = (
    b"HTTP/1.1 500 Oops\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4\r\n{"a"\r\n'
)


BROKEN_AT_ONCE = [reply_then(RESET_MID_BODY), reply_then(TRUNCATED_CHUNKED), reply_then(b"")]
BROKEN_AT_ONCE_IDS = ["reset-mid-body", "truncated-chunked", "closed-at-once"]
# Far above any loopback connect, however busy the machine: only a stalled tool reaches it.
PER_TRY_MS = 1000


@pytest.mark.parametrize("handler", BROKEN_AT_ONCE, ids=BROKEN_AT_ONCE_IDS)
async def test_broken_answers_to_a_put_are_replayed_then_end_in_an_envelope_and_leak_nothing(
    make_sidecar, handler
):
    async with raw_tool(handler) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=PER_TRY_MS, circuit_failures=0)

        async def scenario() -> None:
            response = await asyncio.wait_for(sidecar.client.put("/", json={"q": 1}), 10)
            body = await response.json()
            assert response.status == 502
            assert body["error"]["code"] == "UPSTREAM_RESET"
            assert body["error"]["details"]["delivered"] == "maybe"
            assert response.headers["X-Sidecar-Outcome"] == "exhausted"
            assert response.headers["X-Sidecar-Attempts"] == "4"
            assert response.headers["x-should-retry"] == "false"

        await assert_no_leaks(scenario, repeats=5)
    attempts = sidecar.metric("sidecar_upstream_attempts_total", route="default", status="error")
    assert attempts == 4 * 6
    assert sidecar.metric("sidecar_in_flight_requests", route="default") == 0


@pytest.mark.parametrize(
    "handler",
    [*BROKEN_AT_ONCE, reply_then(b"", stall_until_closed)],
    ids=[*BROKEN_AT_ONCE_IDS, "no-head-then-stall"],
)
async def test_broken_answers_to_a_post_are_not_replayed(make_sidecar, handler):
    """The tool may have run the call: the agent, not the sidecar, decides to send it again."""
    calls = 0

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await handler(reader, writer)

    async with raw_tool(counting) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=PER_TRY_MS)
        response = await sidecar.client.post("/", json={"q": 1})
        body = await response.json()

    assert calls == 1
    assert response.status in (502, 504)
    assert body["error"]["details"]["delivered"] == "maybe"
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert response.headers["X-Sidecar-Attempts"] == "1"


async def test_an_answer_whose_body_stalls_is_relayed_as_it_is_after_the_inspection_window(
    make_sidecar,
):
    """Its head committed the attempt: no timeout envelope, no replay."""
    calls = 0
    stalled = asyncio.Event()

    async def head_then_stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await read_request_head(reader)
        writer.write(HEADERS_THEN_STALL + b'{"a":')
        await writer.drain()
        await stalled.wait()
        writer.write(b"12}\n")
        await writer.drain()

    async with raw_tool(head_then_stall) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=200, inspect_timeout_ms=100)
        response = await sidecar.client.post("/", json={"q": 1})
        assert response.status == 500
        assert response.headers["X-Sidecar-Attempts"] == "1"
        stalled.set()
        assert await response.read() == b'{"a":12}\n'
    assert calls == 1


async def test_refused_connections_leak_nothing(make_sidecar):
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}", circuit_failures=0)

    async def scenario() -> None:
        response = await sidecar.client.get("/")
        assert response.status == 503
        assert response.headers["X-Sidecar-Outcome"] == "unreachable"
        await response.read()

    await assert_no_leaks(scenario)


async def test_503_forever_leaks_nothing_and_counts_every_attempt(make_tool, make_sidecar):
    tool = await make_tool(scripted(lambda: web.json_response({}, status=503)))
    sidecar = await make_sidecar(tool, circuit_failures=0, retry_budget_min_per_s=1000)

    async def scenario() -> None:
        response = await sidecar.client.get("/")
        assert response.status == 503
        await response.read()

    await assert_no_leaks(scenario, repeats=10)
    assert len(tool.seen) == 4 * 11
    assert sidecar.metric("sidecar_retries_total", route="default", reason="server_error") == 3 * 11
    assert (
        sidecar.metric("sidecar_requests_total", route="default", method="GET", outcome="exhausted")
        == 11
    )


@pytest.mark.parametrize(
    "retry_after", ["99999999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT", "1e309", "-1"]
)
async def test_absurd_retry_after_never_makes_the_agent_wait(make_tool, make_sidecar, retry_after):
    answer = scripted(
        lambda: web.json_response({"e": 1}, status=429, headers={"Retry-After": retry_after})
    )
    tool = await make_tool(answer)
    sidecar = await make_sidecar(tool, backoff_jitter="none", backoff_base_ms=100, max_retries=1)

    response = await sidecar.client.get("/")

    assert response.status == 429
    assert all(wait <= 60 for wait in sidecar.sleep.waits)
    assert len(tool.seen) in (1, 2)


async def test_agent_leaving_during_an_attempt_cancels_the_upstream_call(make_tool, make_sidecar):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        started.set()
        try:
            await hang()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.json_response({})

    tool = await make_tool(slow)
    sidecar = await make_sidecar(tool)

    request = asyncio.create_task(sidecar.client.get("/"))
    await asyncio.wait_for(started.wait(), timeout=5)
    request.cancel()
    await asyncio.wait_for(cancelled.wait(), timeout=2)
    # The request is finished once it is no longer in flight: nothing can follow.
    await eventually(lambda: sidecar.metric("sidecar_in_flight_requests", route="default") == 0)

    assert len(tool.seen) == 1
    assert sidecar.sleep.waits == []


async def test_a_dead_llm_endpoint_returns_the_tools_answer(make_tool, make_sidecar):
    async def not_found(request: web.Request) -> web.Response:
        return web.json_response(
            {"success": False, "error": {"code": "NOT_FOUND", "retryable": True}}, status=404
        )

    tool = await make_tool(not_found)
    sidecar = await make_sidecar(
        tool, llm_base_url=f"http://127.0.0.1:{unused_port()}/v1", llm_timeout_ms=500
    )

    # A dead model costs no more than its failed call: no hang, no retry of the model.
    response = await asyncio.wait_for(sidecar.client.post("/", json={"city": "Atlantis"}), 10)

    assert response.status == 404
    assert (await response.json())["error"]["code"] == "NOT_FOUND"
    assert sidecar.metric("sidecar_llm_requests_total", result="error") == 1


@pytest.mark.slow
async def test_a_thousand_requests_in_backoff_are_all_answered_in_bounded_memory(
    make_tool, make_sidecar
):
    first_seen: set[str] = set()

    async def recovering(request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        if key not in first_seen:
            first_seen.add(key)
            return web.json_response({}, status=503)
        await asyncio.sleep(0.2)
        return web.json_response({"success": True})

    tool = await make_tool(recovering)
    sidecar = await make_sidecar(
        tool,
        sleep=asyncio.sleep,
        backoff_base_ms=300,
        backoff_jitter="equal",
        request_timeout_ms=120000,  # a thousand at once on a busy machine: memory, not time
        retry_budget_ratio=1.0,
        circuit_failures=0,
        upstream_max_connections=0,
    )
    rss_before = _rss_bytes()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as agent:

        async def call() -> int:
            async with agent.get(sidecar.client.make_url("/")) as response:
                await response.read()
                return response.status

        statuses = await asyncio.wait_for(
            asyncio.gather(*(call() for _ in range(1000))), timeout=60
        )

    assert statuses == [200] * 1000
    assert len(tool.seen) == 2000
    assert _rss_bytes() - rss_before < 150 * 1024 * 1024
    assert sidecar.metric("sidecar_retries_total", route="default", reason="server_error") == 1000


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


async def test_budget_holds_concurrent_retries_to_its_ratio(make_tool, make_sidecar):
    tool = await make_tool(scripted(lambda: web.json_response({}, status=503)))
    sidecar = await make_sidecar(
        tool, retry_budget_ratio=0.2, retry_budget_min_per_s=0.5, circuit_failures=0
    )

    responses = await asyncio.gather(*(sidecar.client.get("/") for _ in range(100)))

    assert all(response.status == 503 for response in responses)
    retries = len(tool.seen) - 100
    assert retries <= 0.2 * 100 + 0.5 * 10
    assert sidecar.metric("sidecar_retry_budget_exhausted_total", route="default") >= 75
