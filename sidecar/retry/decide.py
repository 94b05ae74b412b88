"""After an attempt: stop, wait and send the same payload, ask for a repair, or send one.

One pure function over a small frozen record of what is known (in the manner of tenacity's
``RetryCallState``): the engine gathers the record, calls ``decide``, and carries out what
it says. Every rule that ends a request or lets it go on is here, in the order it applies;
the engine only does the I/O (sending, sleeping, asking the repair layers, spending the
budget the decision counted on).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.outcomes import Outcome, Wait
from sidecar.retry.classify import Action, Verdict
from sidecar.retry.policy import Backoff, Limits, plan_wait


@dataclass(frozen=True, slots=True)
class RepairAnswer:
    """What the repair layers made of a failed attempt."""

    layer: str | None  # the layer that made a new payload; None: no layer could
    retry_same: bool = False  # the model judged the failure transient


@dataclass(frozen=True, slots=True)
class AfterAttempt:
    """What is known after an attempt, as far as deciding needs it."""

    verdict: Verdict
    retries: int  # retries made before this decision
    limits: Limits
    time_left_s: float  # until the retry window ends
    budget_left: bool  # the route's retry budget would allow one more retry
    replayable: bool  # the body is buffered (a streamed one goes once)
    safe_to_repeat: bool  # the call may run twice at the tool without harm
    cut_by_deadline: bool = False  # its timeout was the deadline's, not the per-try one
    slow_body: bool = False  # the answer's body did not come within the inspection window
    not_connected: bool = False  # nothing reached the tool
    requested_s: float | None = None  # the wait the tool asked for
    previous_wait_s: float | None = None
    repair: RepairAnswer | None = None  # set once the repair layers were asked
    tool_answering: bool = True  # the tool's recent requests show it up


@dataclass(frozen=True, slots=True)
class Stop:
    outcome: Outcome
    note: str | None = None  # why, for the trail: ``stop=deadline``, ``repair=none``, …


@dataclass(frozen=True, slots=True)
class Retry:
    """Send the same payload again after ``wait``."""

    wait: Wait


@dataclass(frozen=True, slots=True)
class AskRepair:
    """Ask the repair layers for a new payload, then decide again with their answer."""


@dataclass(frozen=True, slots=True)
class SendRepaired:
    """Send the repaired payload now."""

    layer: str


Decision = Stop | Retry | AskRepair | SendRepaired

# Most requests end in one of these: made once (they are frozen) rather than per request.
_OK = Stop(Outcome.OK)
_RECOVERED = Stop(Outcome.RECOVERED)


def decide(state: AfterAttempt, backoff: Backoff) -> Decision:
    """The contract's rules, after one attempt, in the order they apply."""
    verdict = state.verdict
    if verdict.action is Action.DONE:
        return done(verdict, state.retries, slow_body=state.slow_body)
    if verdict.reason == "timeout" and state.cut_by_deadline:
        return Stop(Outcome.DEADLINE, "stop=deadline")
    if not state.replayable or (verdict.only_if_safe and not state.safe_to_repeat):
        # Sending it again could run the tool's work twice; the agent decides.
        return Stop(Outcome.NOT_RETRYABLE, "stop=not_replayable")
    if verdict.action is Action.REPAIR:
        repair = state.repair
        if repair is None:
            return AskRepair()
        if repair.layer is not None:
            return _send_repaired(state, repair.layer)
        if not repair.retry_same:
            return Stop(Outcome.NOT_RETRYABLE, "repair=none")
    return _retry_same(state, backoff)


def done(verdict: Verdict, retries: int, *, slow_body: bool) -> Stop:
    """An answer that goes back as it is (a ``DONE`` verdict): the first rule of ``decide``,
    which needs none of the rest of what is known. The retry machine asks it first, so the
    most common end of a request gathers no more."""
    if verdict.success:
        return _OK if retries == 0 else _RECOVERED
    if verdict.reason == "overloaded":
        return Stop(Outcome.OVERLOADED)
    return Stop(Outcome.NOT_RETRYABLE, "stop=slow_body" if slow_body else None)


def _send_repaired(state: AfterAttempt, layer: str) -> Decision:
    if state.retries >= state.limits.max_retries:
        return _stopped(Outcome.EXHAUSTED)
    if state.time_left_s <= 0:
        return _stopped(Outcome.DEADLINE)
    if not state.budget_left:
        return _stopped(Outcome.BUDGET)
    return SendRepaired(layer)


def _retry_same(state: AfterAttempt, backoff: Backoff) -> Decision:
    plan = plan_wait(
        retries_done=state.retries,
        limits=state.limits,
        requested_s=state.requested_s,
        backoff=backoff,
        previous_s=state.previous_wait_s,
        time_left_s=state.time_left_s,
        unreachable=state.not_connected,
        tool_answering=state.tool_answering,
    )
    if isinstance(plan, Outcome):
        return _stopped(plan)
    if not state.budget_left:
        return _stopped(Outcome.BUDGET)
    return Retry(plan)


def _stopped(outcome: Outcome) -> Stop:
    return Stop(outcome, f"stop={outcome.value}")
