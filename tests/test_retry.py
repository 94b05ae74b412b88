"""The decision matrix end to end: scripted tools on loopback, the sidecar between."""

from __future__ import annotations

import asyncio
import gzip
import time
from email.utils import formatdate
from functools import partial

import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from tests.conftest import FakeClock, eventually, hang, scripted, unused_port


def json_answer(status: int, body: object, headers: dict[str, str] | None = None):
    return partial(web.json_response, body, status=status, headers=headers)


def text_answer(status: int, text: str, headers: dict[str, str] | None = None):
    return partial(web.Response, status=status, text=text, headers=headers)


OK = json_answer(200, {"success": True, "data": {"temp_c": 21}})
UNAVAILABLE = json_answer(503, {"success": False, "error": {"code": "BUSY", "message": "busy"}})


def gomind(status: int, code: str, category: str, retryable: bool, **details: object):
    return json_answer(
        status,
        {
            "success": False,
            "error": {
                "code": code,
                "message": f"{code} happened",
                "category": category,
                "retryable": retryable,
                "details": details,
            },
        },
    )


async def test_503_503_200_recovers_with_headers_metrics_and_logs(make_tool, make_sidecar):
    tool = await make_tool(scripted(UNAVAILABLE, UNAVAILABLE, OK))
    sidecar = await make_sidecar(tool)

    with capture_logs() as logs:
        response = await sidecar.client.post("/weather", json={"city": "Tokyo"})
        body = await response.json()

    assert response.status == 200
    assert body == {"success": True, "data": {"temp_c": 21}}
    assert response.headers["X-Sidecar-Attempts"] == "3"
    assert response.headers["X-Sidecar-Outcome"] == "recovered"
    first, second = sidecar.sleep.waits
    assert 0 <= first <= 1.0 and 0 <= second <= 2.0  # full jitter under 1 s, then 2 s
    trail = response.headers["X-Sidecar-Trail"].split(", ")
    assert trail[0].startswith("503 backoff=") and trail[1].startswith("503 backoff=")
    assert trail[2] == "200"
    assert [seen.body for seen in tool.seen] == [b'{"city": "Tokyo"}'] * 3

    def metric(name: str, **labels: str) -> float:
        return sidecar.metric(name, route="default", **labels)

    assert metric("sidecar_requests_total", method="POST", outcome="recovered") == 1
    assert metric("sidecar_upstream_attempts_total", status="503") == 2
    assert metric("sidecar_upstream_attempts_total", status="200") == 1
    assert metric("sidecar_retries_total", reason="server_error") == 2
    assert metric("sidecar_retry_wait_seconds_count", source="backoff") == 2
    assert metric("sidecar_circuit_state", tool="/weather") == 0

    events = [entry["event"] for entry in logs]
    assert events == [
        "request_received",
        "upstream_attempt",
        "retry_scheduled",
        "upstream_attempt",
        "retry_scheduled",
        "upstream_attempt",
        "recovery_succeeded",
        "request_done",
    ]
    scheduled = [entry for entry in logs if entry["event"] == "retry_scheduled"]
    assert [entry["attempt"] for entry in scheduled] == [1, 2]
    assert all(entry["status"] == 503 and entry["reason"] == "server_error" for entry in scheduled)
    assert scheduled[0]["error_code"] == "BUSY"
    assert scheduled[0]["delay_ms"] == round(first * 1000)


async def test_idempotency_key_is_added_once_and_kept_across_retries(make_tool, make_sidecar):
    tool = await make_tool(scripted(UNAVAILABLE, OK, UNAVAILABLE, OK))
    sidecar = await make_sidecar(tool)

    await sidecar.client.post("/", json={})
    await sidecar.client.post("/", json={}, headers={"Idempotency-Key": "agent-key"})

    keys = [seen.headers.get("Idempotency-Key") for seen in tool.seen]
    assert keys[0] == keys[1] and len(keys[0]) == 36
    assert keys[2:] == ["agent-key", "agent-key"]


async def test_idempotency_header_can_be_disabled(make_tool, make_sidecar):
    tool = await make_tool(scripted(OK))
    sidecar = await make_sidecar(tool, idempotency_header="")

    await sidecar.client.post("/", json={})

    assert "Idempotency-Key" not in tool.seen[0].headers


async def test_first_attempt_success_is_ok(make_tool, make_sidecar):
    sidecar = await make_sidecar(await make_tool(scripted(OK)))

    with capture_logs() as logs:
        response = await sidecar.client.get("/")

    assert response.headers["X-Sidecar-Outcome"] == "ok"
    assert response.headers["X-Sidecar-Attempts"] == "1"
    assert response.headers["X-Sidecar-Trail"] == "200"
    assert [entry["log_level"] for entry in logs] == ["debug", "debug", "debug"]


async def test_503_forever_is_exhausted_and_the_agent_gets_the_tools_last_answer(
    make_tool, make_sidecar
):
    body = b'{"success": false, "error": {"code": "DOWN", "message": "still down"}}'
    tool = await make_tool(
        scripted(partial(web.Response, status=503, body=body, content_type="application/json"))
    )
    sidecar = await make_sidecar(tool)

    with capture_logs() as logs:
        response = await sidecar.client.get("/")

    assert response.status == 503
    assert await response.read() == body
    assert len(tool.seen) == 4
    assert response.headers["X-Sidecar-Outcome"] == "exhausted"
    assert response.headers["X-Sidecar-Attempts"] == "4"
    assert response.headers["X-Sidecar-Trail"].endswith("503 stop=exhausted")
    assert "recovery_failed" in [entry["event"] for entry in logs]


async def test_connect_errors_end_unreachable_with_the_contract_envelope(make_sidecar):
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}", max_retries=2)

    response = await sidecar.client.post("/", json={})

    assert response.status == 503
    assert (await response.json())["error"]["code"] == "UPSTREAM_UNREACHABLE"
    assert response.headers["X-Sidecar-Outcome"] == "unreachable"
    assert response.headers["X-Sidecar-Attempts"] == "3"
    assert response.headers["X-Sidecar-Trail"].startswith("connect_error backoff=")
    assert sidecar.metric("sidecar_retries_total", route="default", reason="connect_error") == 2


async def test_a_real_answer_beats_a_later_connect_error(make_sidecar):
    """Once the tool has answered, giving up returns that answer, not an invented one."""
    answer = b"HTTP/1.1 503 Busy\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nbusy"

    async def answer_once_then_vanish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await reader.readuntil(b"\r\n\r\n")
        server.close()
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_once_then_vanish, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sidecar = await make_sidecar(f"http://127.0.0.1:{port}", max_retries=2)

    response = await sidecar.client.get("/")

    assert response.status == 503
    assert await response.read() == b"busy"
    assert response.headers["X-Sidecar-Outcome"] == "unreachable"
    assert response.headers["X-Sidecar-Trail"].startswith("503 backoff=")
    assert response.headers["X-Sidecar-Trail"].endswith("connect_error stop=unreachable")


async def test_timeouts_are_retried(make_tool, make_sidecar):
    async def slow_then_fast(request: web.Request) -> web.Response:
        if len(tool.seen) == 1:
            await hang()
        return web.json_response({"success": True})

    tool = await make_tool(slow_then_fast)
    sidecar = await make_sidecar(tool, per_try_timeout_ms=200)

    response = await sidecar.client.get("/")

    assert response.status == 200
    assert response.headers["X-Sidecar-Trail"].startswith("timeout backoff=")
    assert response.headers["X-Sidecar-Outcome"] == "recovered"
    assert sidecar.metric("sidecar_retries_total", route="default", reason="timeout") == 1


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failures_are_never_retried(make_tool, make_sidecar, status):
    tool = await make_tool(scripted(gomind(status, "AUTH", "AUTH_ERROR", True)))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/")

    assert response.status == status
    assert len(tool.seen) == 1
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"


@pytest.mark.parametrize(
    ("answer", "retried"),
    [
        (text_answer(404, "no such page"), False),
        (json_answer(409, {"detail": "conflict"}), False),
        (gomind(503, "DOWN", "SERVICE_ERROR", False), False),
        (json_answer(501, {"error": "not implemented"}), False),
        (gomind(500, "OOPS", "SERVICE_ERROR", True), True),
        (text_answer(502, "<html>bad gateway</html>"), True),
        (text_answer(504, "gateway timeout"), True),
    ],
    ids=["404", "409", "503-envelope-says-no", "501", "500", "502-html", "504"],
)
async def test_status_and_envelope_decide_whether_to_retry(
    make_tool, make_sidecar, answer, retried
):
    tool = await make_tool(scripted(answer, OK))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/")

    assert len(tool.seen) == (2 if retried else 1)
    assert response.headers["X-Sidecar-Outcome"] == ("recovered" if retried else "not-retryable")


@pytest.mark.parametrize(
    "answer",
    [
        text_answer(
            400, "json: cannot unmarshal string into Go struct field Request.lat of type float64"
        ),
        json_answer(
            422,
            {
                "detail": [
                    {
                        "loc": ["body", "lat"],
                        "msg": "Input should be a valid number",
                        "type": "float_parsing",
                    }
                ]
            },
        ),
        gomind(404, "LOCATION_NOT_FOUND", "NOT_FOUND", True, hint="use 'City, Country'"),
    ],
    ids=["go-unmarshal", "fastapi-422", "retryable-404-envelope"],
)
async def test_repairable_failures_are_not_replayed_unchanged(make_tool, make_sidecar, answer):
    tool = await make_tool(scripted(answer, OK))
    sidecar = await make_sidecar(tool, repair="off")

    response = await sidecar.client.post("/", json={"lat": "35.6"})

    assert len(tool.seen) == 1
    assert response.status in (400, 404, 422)
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert response.headers["X-Sidecar-Trail"].endswith(" repair=none")


@pytest.mark.parametrize(
    ("category", "retried", "reason"),
    [
        ("RATE_LIMIT", True, "rate_limited"),
        ("SERVICE_ERROR", True, "server_error"),
        ("INPUT_ERROR", False, None),
        ("AUTH_ERROR", False, None),
        ("SOMETHING_NEW", False, None),
    ],
)
async def test_200_with_success_false_is_decided_by_its_category(
    make_tool, make_sidecar, category, retried, reason
):
    failed = gomind(200, "X", category, None)
    tool = await make_tool(scripted(failed, failed, failed, failed))
    sidecar = await make_sidecar(tool, max_retries=1)

    response = await sidecar.client.get("/")

    assert response.status == 200, "the agent still gets the real status"
    assert (await response.json())["error"]["category"] == category
    assert len(tool.seen) == (2 if retried else 1)
    if reason:
        assert sidecar.metric("sidecar_retries_total", route="default", reason=reason) == 1


def _http_date(seconds_from_now: float) -> str:
    return formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.mark.parametrize(
    ("first", "expected_wait"),
    [
        (json_answer(429, {}, {"Retry-After": "2"}), 2.0),
        (json_answer(503, {}, {"Retry-After": "7"}), 7.0),
        (json_answer(429, {}, {"RateLimit-Reset": "3"}), 3.0),
        (json_answer(429, {}, {"X-RateLimit-Reset": "4"}), 4.0),
        (gomind(429, "RATE", "RATE_LIMIT", True, retry_after="1500ms"), 1.5),
        (gomind(429, "RATE", "RATE_LIMIT", True, retry_after="2m"), None),  # over the maximum
        (gomind(503, "BUSY", "SERVICE_ERROR", True, retry_after=5), 5.0),
        (
            json_answer(
                429,
                {
                    "error": {
                        "code": "RATE",
                        "category": "RATE_LIMIT",
                        "recovery": {
                            "is_retryable": True,
                            "retry_strategy": {"suggested_delay": 2500},
                        },
                    }
                },
            ),
            2.5,
        ),
    ],
    ids=[
        "retry-after",
        "retry-after-on-503",
        "ratelimit-reset",
        "x-ratelimit-reset",
        "details-ms",
        "details-minutes-over-max",
        "details-number",
        "mira-suggested-delay",
    ],
)
async def test_every_wait_source_is_honoured(make_tool, make_sidecar, first, expected_wait):
    tool = await make_tool(scripted(first, OK))
    sidecar = await make_sidecar(tool, max_retry_after_ms=60000, retry_window_ms=120000)

    response = await sidecar.client.get("/")

    if expected_wait is None:  # returned at once rather than sleeping past the maximum
        assert sidecar.sleep.waits == []
        assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
        return
    [wait] = sidecar.sleep.waits
    assert expected_wait <= wait <= expected_wait * 1.25  # spread, never shortened
    assert response.status == 200
    assert "retry_after=" in response.headers["X-Sidecar-Trail"]
    assert (
        sidecar.metric("sidecar_retry_wait_seconds_count", route="default", source="retry_after")
        == 1
    )


async def test_http_date_and_unix_time_waits(make_tool, make_sidecar):
    tool = await make_tool(
        scripted(
            json_answer(429, {}, {"Retry-After": _http_date(10)}),
            json_answer(429, {}, {"X-RateLimit-Reset": str(int(time.time()) + 20)}),
            OK,
        )
    )
    sidecar = await make_sidecar(tool, retry_window_ms=120000)

    await sidecar.client.get("/")

    date_wait, unix_wait = sidecar.sleep.waits
    assert 8 <= date_wait <= 10 * 1.25
    assert 18 <= unix_wait <= 20 * 1.25


@pytest.mark.parametrize("value", ["-5", "abc", "1e309", "Mon, 01 Jan 1990 00:00:00 GMT", ""])
async def test_unusable_or_past_retry_after_falls_back_or_retries_now(
    make_tool, make_sidecar, value
):
    tool = await make_tool(scripted(json_answer(503, {}, {"Retry-After": value}), OK))
    sidecar = await make_sidecar(
        tool, backoff_jitter="none", backoff_base_ms=500, backoff_max_ms=500
    )

    response = await sidecar.client.get("/")

    assert response.status == 200
    expected = 0.0 if "1990" in value else 0.5  # a date in the past means now
    assert sidecar.sleep.waits == [expected]


async def test_wait_over_the_maximum_returns_the_answer_now(make_tool, make_sidecar):
    far = _http_date(60 * 60 * 24 * 365 * 60)  # 2080s
    tool = await make_tool(scripted(json_answer(429, {"e": 1}, {"Retry-After": far}), OK))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/")

    assert response.status == 429
    assert await response.json() == {"e": 1}
    assert sidecar.sleep.waits == []
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert response.headers["X-Sidecar-Trail"] == "429 stop=not-retryable"


async def test_wait_past_the_deadline_returns_the_answer_now(make_tool, make_sidecar):
    tool = await make_tool(scripted(json_answer(429, {}, {"Retry-After": "5"}), OK))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/", headers={"X-Sidecar-Timeout-Ms": "2000"})

    assert response.status == 429
    assert sidecar.sleep.waits == []
    assert response.headers["X-Sidecar-Outcome"] == "deadline"


async def test_deadline_cuts_a_slow_retry(make_tool, make_sidecar):
    """The first attempt answers 503 at once; the retry hangs and is cut at the deadline:
    the agent gets the 503 it had."""
    answers = [UNAVAILABLE]

    async def unavailable_then_stalls(request: web.Request) -> web.Response:
        if answers:
            return answers.pop()()
        await hang()

    sidecar = await make_sidecar(await make_tool(unavailable_then_stalls), request_timeout_ms=300)

    response = await sidecar.client.get("/")

    assert response.status == 503
    assert response.headers["X-Sidecar-Outcome"] == "deadline"
    assert response.headers["X-Sidecar-Attempts"] == "2"
    assert response.headers["X-Sidecar-Trail"].endswith("timeout stop=deadline")


async def test_waiting_uses_up_the_deadline(make_tool, make_sidecar):
    """Retry-After: 2 each time and a 5 s retry window: two waits fit, the third does not."""
    tool = await make_tool(scripted(json_answer(503, {}, {"Retry-After": "2"})))
    sidecar = await make_sidecar(tool, clock=FakeClock(), retry_window_ms=5000, max_retries=10)

    response = await sidecar.client.get("/")

    assert response.headers["X-Sidecar-Outcome"] == "deadline"
    assert len(sidecar.sleep.waits) == 2
    assert len(tool.seen) == 3


async def test_max_retries_header_lowers_but_never_raises(make_tool, make_sidecar):
    tool = await make_tool(scripted(UNAVAILABLE))
    sidecar = await make_sidecar(tool, max_retries=2, circuit_failures=0)

    lowered = await sidecar.client.get("/", headers={"X-Sidecar-Max-Retries": "0"})
    raised = await sidecar.client.get("/", headers={"X-Sidecar-Max-Retries": "9"})
    garbage = await sidecar.client.get("/", headers={"X-Sidecar-Max-Retries": "-1"})

    assert lowered.headers["X-Sidecar-Attempts"] == "1"
    assert raised.headers["X-Sidecar-Attempts"] == "3"
    assert garbage.headers["X-Sidecar-Attempts"] == "3"


async def test_streamed_request_bodies_are_never_replayed(make_tool, make_sidecar):
    tool = await make_tool(scripted(UNAVAILABLE))
    sidecar = await make_sidecar(tool, max_body_bytes=16)

    response = await sidecar.client.post("/", data=b"x" * 1024)

    assert len(tool.seen) == 1
    assert response.headers["X-Sidecar-Trail"] == "503 stop=not_replayable"


async def test_budget_holds_retries_under_an_always_failing_upstream(make_tool, make_sidecar):
    tool = await make_tool(scripted(UNAVAILABLE))
    sidecar = await make_sidecar(
        tool, retry_budget_ratio=0.2, retry_budget_min_per_s=0.1, circuit_failures=0
    )

    outcomes = []
    for _ in range(20):
        response = await sidecar.client.get("/")
        outcomes.append(response.headers["X-Sidecar-Outcome"])

    retries = len(tool.seen) - 20
    assert retries <= 0.2 * 20 + 0.1 * 10
    assert outcomes.count("budget-exhausted") >= 15
    assert sidecar.metric("sidecar_retry_budget_exhausted_total", route="default") >= 15
    assert "503 stop=budget-exhausted" in response.headers["X-Sidecar-Trail"]


async def test_circuit_opens_rejects_then_probes_and_closes(make_tool, make_sidecar):
    clock = FakeClock()
    healthy = False

    async def flaky(request: web.Request) -> web.Response:
        if healthy:
            return web.json_response({"success": True})
        return web.json_response({}, status=503)

    tool = await make_tool(flaky)
    sidecar = await make_sidecar(
        tool,
        clock=clock,
        max_retries=0,
        circuit_failures=3,
        circuit_min_calls=0,
        circuit_open_ms=30000,
        circuit_half_open_probes=1,
    )

    for _ in range(3):
        assert (await sidecar.client.get("/")).status == 503
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="/") == 2

    rejected = await sidecar.client.get("/")
    assert rejected.status == 503
    assert (await rejected.json())["error"]["code"] == "CIRCUIT_OPEN"
    assert rejected.headers["Retry-After"] == "30"
    assert rejected.headers["X-Sidecar-Attempts"] == "0"
    assert len(tool.seen) == 3

    clock.now += 30
    healthy = True
    probe = await sidecar.client.get("/")
    assert probe.status == 200
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="/") == 0
    assert (await sidecar.client.get("/")).status == 200


async def test_failed_probe_reopens_the_circuit(make_tool, make_sidecar):
    clock = FakeClock()
    tool = await make_tool(scripted(UNAVAILABLE))
    sidecar = await make_sidecar(
        tool,
        clock=clock,
        max_retries=0,
        circuit_failures=1,
        circuit_min_calls=0,
        circuit_open_ms=1000,
    )

    await sidecar.client.get("/")
    clock.now += 1
    probe = await sidecar.client.get("/")
    after = await sidecar.client.get("/")

    assert probe.headers["X-Sidecar-Trail"] == "503 stop=exhausted"
    assert (await after.json())["error"]["code"] == "CIRCUIT_OPEN"
    assert len(tool.seen) == 2


async def test_parallel_calls_that_recover_never_open_the_circuit(make_tool, make_sidecar):
    """Each call meets two 503s before its 200: many failed attempts, no failed request."""
    calls: dict[str, int] = {}

    async def burst(request: web.Request) -> web.Response:
        call = request.headers["X-Call"]
        calls[call] = calls.get(call, 0) + 1
        if calls[call] <= 2:
            return web.json_response({}, status=503)
        return web.json_response({"success": True})

    tool = await make_tool(burst)
    sidecar = await make_sidecar(tool)  # the shipped circuit defaults

    answers = await asyncio.gather(
        *(sidecar.client.get("/", headers={"X-Call": str(n)}) for n in range(20))
    )

    assert [answer.status for answer in answers] == [200] * 20
    assert {answer.headers["X-Sidecar-Outcome"] for answer in answers} == {"recovered"}
    assert len(tool.seen) == 60
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="/") == 0


async def test_a_call_holding_the_tools_answer_returns_it_when_the_circuit_opens(
    make_tool, make_sidecar
):
    """Other calls open the circuit while this one waits to retry: it keeps its 503."""
    sleeping = asyncio.Event()
    proceed = asyncio.Event()

    async def sleep(seconds: float) -> None:
        sleeping.set()
        await proceed.wait()

    tool = await make_tool(scripted(UNAVAILABLE))
    sidecar = await make_sidecar(
        tool, sleep=sleep, circuit_failures=2, circuit_min_calls=0, max_retries=1
    )

    waiting = asyncio.create_task(sidecar.client.get("/", headers={"X-Sidecar-Max-Retries": "1"}))
    await asyncio.wait_for(sleeping.wait(), timeout=5)
    # Two more calls fail outright (no retries): the route's circuit opens.
    for _ in range(2):
        await sidecar.client.get("/", headers={"X-Sidecar-Max-Retries": "0"})
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="/") == 2
    proceed.set()
    response = await asyncio.wait_for(waiting, timeout=5)

    assert response.status == 503
    assert (await response.json())["error"]["code"] == "BUSY"  # the tool's own answer
    assert response.headers["X-Sidecar-Trail"].endswith("circuit_open")
    assert response.headers["X-Sidecar-Attempts"] == "1"
    assert len(tool.seen) == 3


async def test_agent_leaving_during_a_backoff_stops_all_further_attempts(make_tool, make_sidecar):
    waiting = asyncio.Event()
    cancelled = asyncio.Event()

    async def endless_sleep(seconds: float) -> None:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    tool = await make_tool(scripted(UNAVAILABLE))
    sidecar = await make_sidecar(tool, sleep=endless_sleep)

    request = asyncio.create_task(sidecar.client.get("/"))
    await asyncio.wait_for(waiting.wait(), timeout=5)
    request.cancel()
    await asyncio.wait_for(cancelled.wait(), timeout=5)
    # The request is finished once it is no longer in flight: no attempt can follow.
    await eventually(lambda: sidecar.metric("sidecar_in_flight_requests", route="default") == 0)

    assert len(tool.seen) == 1


async def test_gzip_envelope_is_read_and_the_final_body_stays_gzip(make_tool, make_sidecar):
    envelope = gzip.compress(
        orjson.dumps(
            {
                "success": False,
                "error": {
                    "code": "RATE",
                    "category": "RATE_LIMIT",
                    "retryable": True,
                    "details": {"retry_after": "3s"},
                },
            }
        )
    )
    final = gzip.compress(b'{"success": true}')

    def gz(status: int, body: bytes):
        return partial(
            web.Response,
            status=status,
            body=body,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    tool = await make_tool(scripted(gz(429, envelope), gz(200, final)))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/", headers={"Accept-Encoding": "gzip"})

    [wait] = sidecar.sleep.waits
    assert 3.0 <= wait <= 3.75
    assert await response.read() == final


async def test_invalid_gzip_and_false_json_are_decided_by_status(make_tool, make_sidecar):
    broken = partial(
        web.Response,
        status=503,
        body=b"\x1f\x8bnot really gzip",
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    lying = partial(web.Response, status=503, body=b"{not json", content_type="application/json")
    tool = await make_tool(scripted(broken, lying))
    sidecar = await make_sidecar(tool, max_retries=1)

    response = await sidecar.client.get("/")

    assert len(tool.seen) == 2
    assert await response.read() == b"{not json"
    assert response.headers["X-Sidecar-Outcome"] == "exhausted"


def sse(message: dict):
    return partial(
        web.Response,
        body=b": ping\n\nevent: message\ndata: " + orjson.dumps(message) + b"\n\n",
        headers={"Content-Type": "text/event-stream"},
    )


MCP_RESULT = sse(
    {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "ok"}]}}
)


async def test_a_jsonrpc_error_is_not_replayed(make_tool, make_sidecar):
    internal_error = sse({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "x"}})
    tool = await make_tool(scripted(internal_error, MCP_RESULT))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "x"})

    assert len(tool.seen) == 1
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert response.headers["x-should-retry"] == "false"
    assert b"-32603" in await response.read()


async def test_a_jsonrpc_error_is_replayed_only_when_it_asks_for_a_retry(make_tool, make_sidecar):
    """``data.retryable: true`` is the server's word that the call took no effect: the call
    goes again though nothing says it is safe to repeat; an error without it goes back."""
    busy = sse(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {"code": -32000, "message": "busy", "data": {"retryable": True}},
        }
    )
    failed = sse({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "failed"}})
    tool = await make_tool(scripted(busy, busy, MCP_RESULT, failed))
    sidecar = await make_sidecar(tool)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "pay"}}

    asked = await sidecar.client.post("/mcp", json=call)
    not_asked = await sidecar.client.post("/mcp", json=call)

    assert asked.headers["X-Sidecar-Outcome"] == "recovered"
    assert asked.headers["X-Sidecar-Attempts"] == "3"
    assert b'"result"' in await asked.read()
    assert not_asked.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert not_asked.headers["X-Sidecar-Attempts"] == "1"
    assert len(tool.seen) == 4
