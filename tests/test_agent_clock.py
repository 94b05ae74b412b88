"""The agent's clock: the shipped defaults end their retries inside a 5 s agent timeout; the
retry window never cuts a slow tool's first attempt, and the whole request's deadline cuts
everything, the first attempt included."""

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
    tuning: Tuning,
    first_attempt_s: float,
    retry_attempt_s: float,
    answer: Reply | AttemptError,
    tool_answering: bool = True,
) -> tuple[float, Outcome]:
    """When a request whose every attempt gets ``answer`` ends, with every random wait at
    its largest (full jitter at its step, a requested wait stretched by the full 25 %);
    the first attempt takes ``first_attempt_s``, each retry ``retry_attempt_s`` unless the
    retry window cuts it first. ``tool_answering``: the tool's recent requests show it up."""
    backoff = Backoff(
        base_s=tuning.backoff_base_ms / 1000,
        cap_s=tuning.backoff_max_ms / 1000,
        multiplier=tuning.backoff_multiplier,
        jitter=tuning.backoff_jitter,
        uniform=lambda low, high: high,
    )
    limits = Limits(tuning.max_retries, tuning.max_retry_after_ms / 1000)
    window_s = tuning.retry_window_ms / 1000
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
            time_left_s=window_s - now,
            budget_left=True,
            replayable=True,
            safe_to_repeat=True,
            cut_by_deadline=cut,
            requested_s=requested_s,
            previous_wait_s=previous,
            tool_answering=tool_answering,
        )
        decision = decide(known, backoff)
        if isinstance(decision, Stop):
            return now, decision.outcome
        assert isinstance(decision, Retry)
        now += decision.wait.seconds
        previous = decision.wait.seconds
        retries += 1
        allowed = attempt_timeout_s(per_try_s, deadline_s - now, window_s - now, first=False)
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
        (1.5, 1.5, UNAVAILABLE),  # slow 503s: the window cuts the third retry
        (3.9, 1.0, UNAVAILABLE),  # a first attempt ending just before the window
        (0.0, 0.0, RATE_LIMITED),  # Retry-After: 1, stretched to 1.25 s, three times
        (0.0, 30.0, AttemptError.CONNECT),  # connects that hang: cut by the window
        (0.0, 0.0, AttemptError.RESET),
    ],
)
def test_the_shipped_schedule_ends_before_an_agents_5_s_timeout(first_s, retry_s, answer):
    end_s, outcome = worst_case_end_s(Tuning(), first_s, retry_s, answer)

    assert end_s <= AGENT_TIMEOUT_S - ROOM_FOR_THE_ANSWER_S
    assert outcome in (Outcome.EXHAUSTED, Outcome.UNREACHABLE, Outcome.DEADLINE)


@pytest.mark.parametrize(
    ("tool_answering", "longest_s"),
    [
        # A tool whose recent requests show it up: the cap's ten retries, their waits
        # 25 + 50 + 100 + 200 ms and then 250 ms six times.
        (True, 1.875),
        # One that does not: three retries, as 0.5 gave every tool, 25 + 50 + 100 ms.
        (False, 0.175),
    ],
)
def test_the_shipped_waits_are_in_envoys_range(tool_answering, longest_s):
    """Envoy's retry back-off: 25 ms base, ten times that at most."""
    end_s, outcome = worst_case_end_s(Tuning(), 0.0, 0.0, UNAVAILABLE, tool_answering)

    assert (Tuning().backoff_base_ms, Tuning().backoff_max_ms) == (25, 250)
    assert end_s == pytest.approx(longest_s)
    assert outcome is Outcome.EXHAUSTED


@pytest.mark.parametrize(
    ("per_try_s", "to_deadline_s", "to_window_s", "first", "allowed_s"),
    [
        (30.0, 120.0, 4.0, True, 30.0),  # a slow tool's first call runs past the window
        (30.0, 120.0, -1.0, True, 30.0),
        (30.0, 120.0, 4.0, False, 4.0),  # a retry ends with the window
        (2.0, 120.0, 4.0, False, 2.0),
        (30.0, 0.5, 0.5, True, 0.5),  # the whole request's deadline cuts the first too
        (30.0, 2.0, 4.0, False, 2.0),  # ... and any retry
    ],
)
def test_the_window_bounds_retries_and_the_deadline_everything(
    per_try_s, to_deadline_s, to_window_s, first, allowed_s
):
    assert attempt_timeout_s(per_try_s, to_deadline_s, to_window_s, first=first) == allowed_s


async def test_a_tool_slower_than_the_window_answers_and_one_slower_than_the_deadline_does_not(
    make_tool, make_sidecar
):
    """The retry window (here 0.3 s) is sized for retries: a tool whose healthy answer takes
    0.5 s still gets its call through. The whole request's deadline, configured (0.3 s) or
    the agent's own (0.2 s), cuts the first attempt too: nobody waits past it (0.5: the
    configured one did not, and the answer came at 0.5 s)."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.json_response({"success": True})

    tool = await make_tool(slow)
    windowed = await make_sidecar(tool, retry_window_ms=300, per_try_timeout_ms=5000)
    bounded = await make_sidecar(tool, request_timeout_ms=300, per_try_timeout_ms=5000)

    answered = await windowed.client.post("/", json={})
    cut_by_agent = await windowed.client.post("/", json={}, headers={"X-Sidecar-Timeout-Ms": "200"})
    cut = await bounded.client.post("/", json={})

    assert answered.status == 200
    assert answered.headers["X-Sidecar-Outcome"] == "ok"
    for response in (cut_by_agent, cut):
        assert response.status == 504
        assert response.headers["X-Sidecar-Outcome"] == "deadline"
        error = (await response.json())["error"]
        assert (error["code"], error["details"]["reason"]) == ("UPSTREAM_TIMEOUT", "deadline")
