"""The agent's clock: the shipped defaults end their retries inside a 5 s agent timeout, and
the deadline that bounds retries never cuts a slow tool's first attempt."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from sidecar.config.model import Tuning
from sidecar.outcomes import AttemptError, Outcome
from sidecar.retry.classify import classify
from sidecar.retry.decide import AfterAttempt, Retry, Stop, decide
from sidecar.retry.policy import Backoff, Limits, attempt_timeout_s
from sidecar.tool.envelopes import Reply

# openai-agents' MCPServerStreamableHttp and httpx both give up after 5 s by default.
AGENT_TIMEOUT_S = 5.0
# What the answer needs after the sidecar's last attempt: relaying it, the agent's own
# connect and parse. The schedule must end this long before the agent's timeout.
ROOM_FOR_THE_ANSWER_S = 1.0


def worst_case_end_s(
    tuning: Tuning, first_attempt_s: float, retry_attempt_s: float, answer: Reply | AttemptError
) -> tuple[float, Outcome]:
    """When a request whose every attempt gets ``answer`` ends, with every random wait at
    its largest (full jitter at its step, a requested wait stretched by the full 25 %);
    the first attempt takes ``first_attempt_s``, each retry ``retry_attempt_s`` unless the
    deadline cuts it first."""
    backoff = Backoff(
        base_s=tuning.backoff_base_ms / 1000,
        cap_s=tuning.backoff_max_ms / 1000,
        multiplier=tuning.backoff_multiplier,
        jitter=tuning.backoff_jitter,
        uniform=lambda low, high: high,
    )
    limits = Limits(tuning.max_retries, tuning.max_retry_after_ms / 1000)
    deadline_s = tuning.request_timeout_ms / 1000
    per_try_s = tuning.per_try_timeout_ms / 1000
    verdict = classify(answer, tuning.retry_on_status)
    requested_s = None
    if isinstance(answer, Reply) and answer.status == 429:
        requested_s = 1.0  # Retry-After: 1, as the rate-limited tool sent
    now, retries, previous, cut = first_attempt_s, 0, None, False
    while True:
        known = AfterAttempt(
            verdict=verdict,
            retries=retries,
            limits=limits,
            time_left_s=deadline_s - now,
            budget_left=True,
            replayable=True,
            safe_to_repeat=True,
            cut_by_deadline=cut,
            requested_s=requested_s,
            previous_wait_s=previous,
        )
        decision = decide(known, backoff)
        if isinstance(decision, Stop):
            return now, decision.outcome
        assert isinstance(decision, Retry)
        now += decision.wait.seconds
        previous = decision.wait.seconds
        retries += 1
        allowed = attempt_timeout_s(per_try_s, deadline_s - now, first=False, agent_deadline=False)
        cut = retry_attempt_s > allowed
        if cut:
            verdict = classify(AttemptError.TIMEOUT, tuning.retry_on_status)
        now += min(retry_attempt_s, allowed)


UNAVAILABLE = Reply(503, None, "")
RATE_LIMITED = Reply(429, None, "")


@pytest.mark.parametrize(
    ("first_s", "retry_s", "answer"),
    [
        (0.0, 0.0, UNAVAILABLE),  # instant 503s: the waits alone
        (0.5, 0.5, UNAVAILABLE),
        (1.5, 1.5, UNAVAILABLE),  # slow 503s: the deadline cuts the third retry
        (3.9, 1.0, UNAVAILABLE),  # a first attempt ending just before the deadline
        (0.0, 0.0, RATE_LIMITED),  # Retry-After: 1, stretched to 1.25 s, three times
        (0.0, 30.0, AttemptError.CONNECT),  # connects that hang: cut by the deadline
        (0.0, 0.0, AttemptError.RESET),
    ],
)
def test_the_shipped_schedule_ends_before_an_agents_5_s_timeout(first_s, retry_s, answer):
    end_s, outcome = worst_case_end_s(Tuning(), first_s, retry_s, answer)

    assert end_s <= AGENT_TIMEOUT_S - ROOM_FOR_THE_ANSWER_S
    assert outcome in (Outcome.EXHAUSTED, Outcome.UNREACHABLE, Outcome.DEADLINE)


def test_the_shipped_waits_are_in_envoys_range():
    """Envoy's retry back-off: 25 ms base, ten times that at most. The longest the
    default three retries can wait in all is 25 + 50 + 100 ms."""
    end_s, outcome = worst_case_end_s(Tuning(), 0.0, 0.0, UNAVAILABLE)

    assert (Tuning().backoff_base_ms, Tuning().backoff_max_ms) == (25, 250)
    assert end_s == pytest.approx(0.175)
    assert outcome is Outcome.EXHAUSTED


@pytest.mark.parametrize(
    ("per_try_s", "time_left_s", "first", "agent_deadline", "allowed_s"),
    [
        (30.0, 4.0, True, False, 30.0),  # a slow tool's first call runs to the per-try
        (30.0, -1.0, True, False, 30.0),
        (30.0, 4.0, False, False, 4.0),  # a retry ends by the deadline
        (2.0, 4.0, False, False, 2.0),
        (30.0, 0.5, True, True, 0.5),  # the agent's own deadline binds the first too
    ],
)
def test_the_deadline_bounds_retries_not_the_first_attempt(
    per_try_s, time_left_s, first, agent_deadline, allowed_s
):
    allowed = attempt_timeout_s(per_try_s, time_left_s, first=first, agent_deadline=agent_deadline)
    assert allowed == allowed_s


async def test_a_tool_slower_than_the_deadline_answers_its_first_call(make_tool, make_sidecar):
    """The request deadline (here 0.3 s) is sized for retries: a tool whose healthy answer
    takes 0.5 s still gets its call through; an agent that set its own deadline does not
    wait past it (0.2 s)."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.json_response({"success": True})

    tool = await make_tool(slow)
    sidecar = await make_sidecar(tool, request_timeout_ms=300, per_try_timeout_ms=5000)

    answered = await sidecar.client.post("/", json={})
    cut = await sidecar.client.post("/", json={}, headers={"X-Sidecar-Timeout-Ms": "200"})

    assert answered.status == 200
    assert answered.headers["X-Sidecar-Outcome"] == "ok"
    assert cut.status == 504
    assert cut.headers["X-Sidecar-Outcome"] == "deadline"
    assert (await cut.json())["error"]["code"] == "UPSTREAM_TIMEOUT"
