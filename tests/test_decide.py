"""The decision after an attempt, as a table: no sockets, no clock, no engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.outcomes import Outcome, Wait
from sidecar.retry.classify import Action, Verdict
from sidecar.retry.decide import (
    AfterAttempt,
    AskRepair,
    Decision,
    RepairAnswer,
    Retry,
    SendRepaired,
    Stop,
    decide,
)
from sidecar.retry.policy import Backoff, Limits

# Jitter that always takes the top of its range: every wait below is exact.
BACKOFF = Backoff(base_s=1.0, cap_s=10.0, multiplier=2.0, jitter="full", uniform=lambda a, b: b)

SUCCESS = Verdict(Action.DONE, "success")
SERVER_ERROR = Verdict(Action.RETRY, "server_error", is_failure=True)
RATE_LIMITED = Verdict(Action.RETRY, "rate_limited")
TIMEOUT = Verdict(Action.RETRY, "timeout", is_failure=True, only_if_safe=True)
CONNECT_ERROR = Verdict(Action.RETRY, "connect_error", is_failure=True)
VALIDATION = Verdict(Action.REPAIR, "validation")
AUTH = Verdict(Action.DONE, "auth")
OVERLOADED = Verdict(Action.DONE, "overloaded")
MALFORMED = Verdict(Action.DONE, "malformed", is_failure=True)


def known(verdict: Verdict, **overrides: object) -> AfterAttempt:
    """A first attempt's state with room for everything, changed by ``overrides``."""
    state = AfterAttempt(
        verdict=verdict,
        retries=0,
        limits=Limits(max_retries=3, max_retry_after_s=60.0),
        time_left_s=120.0,
        budget_left=True,
        replayable=True,
        safe_to_repeat=False,
    )
    return replace(state, **overrides)  # type: ignore[arg-type]


TABLE: list[tuple[str, AfterAttempt, Decision]] = [
    ("a first success is ok", known(SUCCESS), Stop(Outcome.OK)),
    ("a later success recovered", known(SUCCESS, retries=2), Stop(Outcome.RECOVERED)),
    ("401/403 go back", known(AUTH), Stop(Outcome.NOT_RETRYABLE)),
    (
        "a slow body of a done answer says so",
        known(AUTH, slow_body=True),
        Stop(Outcome.NOT_RETRYABLE, "stop=slow_body"),
    ),
    ("the sidecar's own saturation", known(OVERLOADED), Stop(Outcome.OVERLOADED)),
    ("a malformed answer is never retried", known(MALFORMED), Stop(Outcome.NOT_RETRYABLE)),
    ("a 503 waits the first backoff", known(SERVER_ERROR), Retry(Wait(1.0, "backoff"))),
    ("the third retry waits 4 s", known(SERVER_ERROR, retries=2), Retry(Wait(4.0, "backoff"))),
    (
        "the retries are spent",
        known(SERVER_ERROR, retries=3),
        Stop(Outcome.EXHAUSTED, "stop=exhausted"),
    ),
    (
        "spent on connect errors",
        known(CONNECT_ERROR, retries=3, not_connected=True),
        Stop(Outcome.UNREACHABLE, "stop=unreachable"),
    ),
    (
        "the tool's wait, stretched",
        known(RATE_LIMITED, requested_s=2.0),
        Retry(Wait(2.5, "retry_after")),
    ),
    (
        "a wait over the maximum goes back now",
        known(RATE_LIMITED, requested_s=61.0),
        Stop(Outcome.NOT_RETRYABLE, "stop=not-retryable"),
    ),
    (
        "a wait past the deadline goes back now",
        known(SERVER_ERROR, time_left_s=0.5),
        Stop(Outcome.DEADLINE, "stop=deadline"),
    ),
    (
        "no budget, no retry",
        known(SERVER_ERROR, budget_left=False),
        Stop(Outcome.BUDGET, "stop=budget-exhausted"),
    ),
    (
        "the retry limit is said before the budget",
        known(SERVER_ERROR, retries=3, budget_left=False),
        Stop(Outcome.EXHAUSTED, "stop=exhausted"),
    ),
    (
        "a delivered call not safe to repeat",
        known(TIMEOUT),
        Stop(Outcome.NOT_RETRYABLE, "stop=not_replayable"),
    ),
    (
        "a delivered call safe to repeat",
        known(TIMEOUT, safe_to_repeat=True),
        Retry(Wait(1.0, "backoff")),
    ),
    (
        "a per-try timeout that was the deadline's",
        known(TIMEOUT, safe_to_repeat=True, cut_by_deadline=True),
        Stop(Outcome.DEADLINE, "stop=deadline"),
    ),
    (
        "a streamed body goes once",
        known(SERVER_ERROR, replayable=False),
        Stop(Outcome.NOT_RETRYABLE, "stop=not_replayable"),
    ),
    ("a validation error asks for a repair", known(VALIDATION), AskRepair()),
    (
        "a repaired payload goes at once",
        known(VALIDATION, repair=RepairAnswer("coercion")),
        SendRepaired("coercion"),
    ),
    (
        "no layer could repair",
        known(VALIDATION, repair=RepairAnswer(None)),
        Stop(Outcome.NOT_RETRYABLE, "repair=none"),
    ),
    (
        "the model judged it transient: the same payload after backoff",
        known(VALIDATION, repair=RepairAnswer(None, retry_same=True)),
        Retry(Wait(1.0, "backoff")),
    ),
    (
        "a repair with no retries left",
        known(VALIDATION, retries=3, repair=RepairAnswer("llm")),
        Stop(Outcome.EXHAUSTED, "stop=exhausted"),
    ),
    (
        "a repair that took the rest of the deadline",
        known(VALIDATION, time_left_s=0.0, repair=RepairAnswer("llm")),
        Stop(Outcome.DEADLINE, "stop=deadline"),
    ),
    (
        "a repair with no budget",
        known(VALIDATION, budget_left=False, repair=RepairAnswer("adjustment")),
        Stop(Outcome.BUDGET, "stop=budget-exhausted"),
    ),
]


@pytest.mark.parametrize(
    ("state", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_the_decision_after_an_attempt(state: AfterAttempt, expected: Decision) -> None:
    assert decide(state, BACKOFF) == expected
