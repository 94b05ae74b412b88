"""The retry life of one request as a state machine: events in, actions out.

In the manner of h11's ``Connection`` and tenacity's ``BaseRetrying.iter()``: the engine
tells the machine what happened — an attempt's judged answer, a sleep done, the repair
layers' answer, the fleet's cooldown read or published, a hedge's timer, the agent's
cancellation — and carries out the action it answers: send, hedge, sleep, ask for a
repair, report, settle the circuit, finish. Every rule of a request's retries is here or in
the pure functions it calls (``decide``, ``policy``): the circuit's and the cooldowns'
refusals, the limits, the deadline, the budget, hedging, the trail. No I/O, no event loop;
its clock is injected, so a whole request's life is one table row (tests/test_machine.py).

The machine owns the trail and the attempt records; each record, and the result, is
immutable once made. The tool's answer is held as an opaque handle (``Held``): the machine
decides when one is dropped, never reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic

from sidecar.outcomes import AttemptError, Outcome, Wait
from sidecar.repair.payload import Payload
from sidecar.retry.classify import Action
from sidecar.retry.decide import (
    AfterAttempt,
    AskRepair,
    Decision,
    RepairAnswer,
    Retry,
    SendRepaired,
    Stop,
    decide,
    done,
)
from sidecar.retry.guards.budget import RetryBudget
from sidecar.retry.guards.circuit import CircuitBreaker, Ticket
from sidecar.retry.policy import RETRIES_WHILE_UNPROVEN, attempt_timeout_s, plan_cooldown
from sidecar.retry.steps import (
    BUDGET_EXHAUSTED,
    CIRCUIT_REFUSED,
    PREPARE,
    READ_COOLDOWN,
    REOPEN_SESSION,
    SETTLE_FAILED,
    SETTLE_OK,
    A,
    Attempt,
    Repair,
    RepairJudged,
    Result,
    Send,
    SendHedged,
    Settle,
    ShareCooldown,
    Step,
    Terms,
    UsePayload,
    WaitCooldown,
    WaitRetry,
    seconds_token,
)

_SUCCEEDED = frozenset({Outcome.OK, Outcome.RECOVERED})

# The times one request's session is opened again: a server that restarts again, or replicas
# behind a balancer that does not keep a session to the one that opened it, which forget
# each new session too, cost at most three sessions a request.
SESSION_REOPENS = 3


class RetryMachine(Generic[A]):
    """One request's retry life. ``start`` gives the first action; each event method the
    next one, until a ``Result``."""

    # Made on every request: slots keep its state off a dict.
    __slots__ = (
        "_answer",
        "_answered_layers",
        "_attempts",
        "_budget",
        "_circuit",
        "_clock",
        "_llm_repairs_left",
        "_payload",
        "_previous_wait",
        "_queue",
        "_records",
        "_reopens_left",
        "_result",
        "_retries",
        "_sent",
        "_then",
        "_ticket",
        "_trail",
        "_unjudged",
        "terms",
    )

    def __init__(
        self,
        terms: Terms,
        *,
        circuit: CircuitBreaker,
        budget: RetryBudget,
        clock: Callable[[], float],
    ) -> None:
        self.terms = terms
        self._circuit, self._budget, self._clock = circuit, budget, clock
        self._ticket: Ticket | None = None
        self._payload: Payload | None = None  # None: the body streams through and goes once
        self._sent: list[Payload] = []
        self._unjudged: str | None = None  # the repair whose payload awaits its answer
        self._llm_repairs_left = terms.llm_max_repairs
        self._trail: list[str] = []
        self._records: list[Attempt] = []
        self._answer: A | None = None
        self._answered_layers: tuple[str, ...] = ()
        self._attempts = self._retries = 0
        self._reopens_left = SESSION_REOPENS
        self._previous_wait: float | None = None
        self._queue: list[Step[A]] = []  # actions due before ``_then``
        # What follows the queue: a function, not a bound method, which would make the
        # machine a reference cycle that only the garbage collector can free.
        self._then: Callable[[RetryMachine[A]], Step[A]] = RetryMachine._decide
        self._result: Result[A] | None = None

    @property
    def ticket(self) -> Ticket:
        """The circuit's admission of the request (once ``start`` admitted it)."""
        assert self._ticket is not None
        return self._ticket

    @property
    def trail(self) -> tuple[str, ...]:
        return tuple(self._trail)

    @property
    def records(self) -> tuple[Attempt, ...]:
        """Every attempt judged so far, in order."""
        return tuple(self._records)

    # Events.

    def start(self) -> Step[A]:
        """The request arrived: is the tool to be called at all?"""
        self._budget.record_request()
        admitted = self._circuit.admit()
        if not isinstance(admitted, Ticket):
            self._trail.append("circuit_open")
            return self._report(CIRCUIT_REFUSED, self._refused(admitted))
        self._ticket = admitted
        return READ_COOLDOWN if self.terms.shares_cooldowns else PREPARE

    def prepared(self, payload: Payload | None) -> Step[A]:
        """The payload that goes first: the agent's, coerced (``None``: streamed)."""
        if payload is not None:
            self._payload = payload
            self._sent.append(payload)
            # The agent's payload, coerced, awaits its answer as a repaired one does.
            self._unjudged = payload.layers[-1] if payload.layers else None
        return self._send()

    def cooldown_read(self, cooldown_s: float) -> Step[A]:
        """The fleet's cooldown of the tool (0: none): wait it out, or end when it is too
        long for this request."""
        if cooldown_s <= 0:
            return self._send() if self._attempts else PREPARE
        terms = self.terms
        plan = plan_cooldown(
            cooldown_s=cooldown_s,
            limits=terms.limits,
            backoff=terms.backoff,
            time_left_s=terms.retry_until - self._clock(),
        )
        if isinstance(plan, Wait):
            self._trail.append(f"{plan.source}={seconds_token(plan.seconds)}")
            self._then = RetryMachine._read_cooldown
            return WaitCooldown(plan.seconds)
        self._trail.append(f"cooldown={seconds_token(cooldown_s)} stop={plan.value}")
        if not self._records:
            assert self._ticket is not None
            self._circuit.abandon(self._ticket)
            return self._refused(cooldown_s)
        last = self._records[-1]
        return self._settle(self._ended(plan, last, paused_for_s=cooldown_s), last)

    def slept(self) -> Step[A]:
        """A wait ended."""
        return self._then(self)

    def resume(self) -> Step[A]:
        """An action that has no answer of its own (a report, a share) was carried out."""
        return self._queue.pop(0) if self._queue else self._then(self)

    def hedge_due(self) -> Send | None:
        """The hedge's timer fired before any answer's head: a copy, when the budget pays."""
        if not self._budget.available():
            return None
        self._budget.spend()
        self._trail.append(f"hedge={seconds_token(self.terms.hedge_after_s)}")
        return self._copy(hedge=True)

    def answered(self, attempt: Attempt, answer: A | None) -> Step[A]:
        """An attempt ended, judged; ``answer`` is the tool's, when it answered."""
        self._records.append(attempt)
        if answer is not None:
            if self._answer is not None:
                self._answer.discard()
            self._answer = answer
            self._answered_layers = self._payload.layers if self._payload is not None else ()
        if self._unjudged is not None:
            judged = "succeeded" if attempt.verdict.success else "failed"
            self._queue.append(RepairJudged(self._unjudged, judged))
            self._unjudged = None
        if self.terms.shares_cooldowns and attempt.requested_s is not None:
            # Only a failed answer's wait is read (``attempt.judge``).
            path = self.terms.path if attempt.path_scoped else None
            self._queue.append(ShareCooldown(attempt.requested_s, path))
        if self._queue:
            self._then = RetryMachine._decide
            return self._queue.pop(0)
        return self._decide()

    def repaired(
        self, payload: Payload | None, layer: str | None, retry_same: bool, llm_repairs: int
    ) -> Step[A]:
        """The repair layers answered: a new ``payload`` from ``layer``, or none (the model
        may have judged the failure transient: ``retry_same``)."""
        self._llm_repairs_left -= llm_repairs
        last = self._records[-1]
        answer = RepairAnswer(layer if payload is not None else None, retry_same)
        return self._carry_out(decide(self._known(last, answer), self.terms.backoff), payload)

    def reopened(self, opened: bool) -> Step[A]:
        """The MCP session the server forgot was ``opened`` again, or could not be: the
        request goes once more on the new session (the 404 proved it never ran), or its
        404 goes back as it came."""
        self._reopens_left = self._reopens_left - 1 if opened else 0
        if not opened:
            return self._decide()
        last = self._records[-1]
        self._trail.append(f"{last.trail_label} session=reopened")
        # A retry, as the agent reads the outcome (``recovered``); the budget, which bounds
        # what retries add to a failing tool's load, pays for none: the call never ran.
        self._retries += 1
        if self._answer is not None:
            self._answer.discard()
            self._answer = None
        return self._send()

    def settled(self) -> Result[A]:
        """The circuit counted the request's verdict."""
        assert self._result is not None
        return self._result

    def cancelled(self) -> Result[A]:
        """The agent cancelled the request: the tool's last whole answer, else the sidecar's
        ``UPSTREAM_TIMEOUT`` (``reason: cancelled``). The circuit counts no verdict for it."""
        self._abandon()
        self._trail.append("stop=cancelled")
        answer = self._answer
        if answer is not None and not answer.complete:
            answer.discard()  # an answer still streaming cannot wait to be relayed
            answer = None
        error = AttemptError.TIMEOUT if answer is None else None
        return Result(Outcome.DEADLINE, self._attempts, self.trail, answer, error, "cancelled")

    def agent_gone(self) -> None:
        """The agent went away: nothing goes back, and no verdict is counted."""
        self._abandon()
        if self._answer is not None:
            self._answer.discard()

    # Rules.

    def _decide(self) -> Step[A]:
        last = self._records[-1]
        if (
            self._reopens_left
            and self.terms.session_reopenable
            and _session_lost(last)
            and self._clock() < self.terms.retry_until
        ):
            return REOPEN_SESSION
        verdict = last.verdict
        if verdict.action is Action.DONE:
            return self._carry_out(done(verdict, self._retries, slow_body=last.slow_body), None)
        decision = decide(self._known(last), self.terms.backoff)
        if isinstance(decision, AskRepair):
            assert self._payload is not None and last.reply is not None
            return Repair(
                last.reply,
                self._attempts,
                self._payload,
                frozenset(sent.fingerprint for sent in self._sent),
                self._llm_repairs_left,
                self.terms.retry_until - self._clock(),
            )
        return self._carry_out(decision, None)

    def _carry_out(self, decision: Decision, payload: Payload | None) -> Step[A]:
        last = self._records[-1]
        if isinstance(decision, Stop):
            label = last.trail_label
            self._trail.append(f"{label} {decision.note}" if decision.note else label)
            settle = self._settle(self._ended(decision.outcome, last), last)
            if decision.outcome is Outcome.BUDGET:
                return self._report(BUDGET_EXHAUSTED, settle)
            return settle
        self._budget.spend()
        self._retries += 1
        if isinstance(decision, SendRepaired):
            assert payload is not None
            self._trail.append(f"{last.trail_label} repair={decision.layer}")
            self._unjudged = decision.layer
            self._payload = payload
            self._sent.append(payload)
            self._then = RetryMachine._gate
            return UsePayload(payload, decision.layer, self._attempts, last.label)
        assert isinstance(decision, Retry)
        return self._wait(decision.wait, last)

    def _wait(self, wait: Wait, last: Attempt) -> WaitRetry:
        answer = self._answer
        if answer is not None and not answer.complete:
            # An answer still streaming holds a connection; it cannot wait for us.
            answer.discard()
            self._answer = None
        verdict = last.verdict
        reason = verdict.reason if verdict.action is Action.RETRY else "server_error"
        self._trail.append(f"{last.trail_label} {wait.source}={seconds_token(wait.seconds)}")
        self._previous_wait = wait.seconds
        self._then = RetryMachine._gate
        return WaitRetry(wait, self._attempts, last.label, reason, last.failure)

    def _gate(self) -> Step[A]:
        """Before a retry: the circuit may have opened meanwhile, the fleet may know a
        cooldown. When the circuit opened, what this request has is what it returns."""
        assert self._ticket is not None
        if not self._circuit.allows_more(self._ticket):
            self._trail.append("circuit_open")
            last = self._records[-1]
            ended = self._ended(last.stopped_outcome, last, self._circuit.open_for_s())
            return self._settle(ended, last)
        return READ_COOLDOWN if self.terms.shares_cooldowns else self._send()

    def _read_cooldown(self) -> Step[A]:
        return READ_COOLDOWN

    def _send(self) -> Step[A]:
        copy = self._copy(hedge=False)
        terms = self.terms
        # A copy is sent only of a call that is safe to run twice and whose body is held.
        if not terms.hedge_after_s or not terms.safe_to_repeat or self._payload is None:
            return copy
        return SendHedged(copy, terms.hedge_after_s)

    def _copy(self, *, hedge: bool) -> Send:
        self._attempts += 1
        terms, now = self.terms, self._clock()
        per_try = attempt_timeout_s(
            terms.per_try_s,
            terms.deadline - now,
            terms.retry_until - now,
            first=self._attempts == 1,
        )
        return Send(self._attempts, now, per_try, hedge)

    def _known(self, attempt: Attempt, repair: RepairAnswer | None = None) -> AfterAttempt:
        """What the decision after ``attempt`` needs to know, as of now."""
        verdict, terms, error = attempt.verdict, self.terms, attempt.error
        return AfterAttempt(
            verdict=verdict,
            retries=self._retries,
            limits=terms.limits,
            time_left_s=terms.retry_until - self._clock(),
            # Summing the budget's window costs a few µs: looked at only when the verdict
            # leaves a retry open (``decide`` reads it for nothing else).
            budget_left=verdict.action is not Action.DONE and self._budget.available(),
            replayable=self._payload is not None,
            safe_to_repeat=terms.replay_always or terms.safe_to_repeat,
            cut_by_deadline=attempt.copy.per_try_s < terms.per_try_s,
            slow_body=attempt.slow_body,
            not_connected=error is not None and error.not_connected,
            requested_s=attempt.requested_s,
            previous_wait_s=self._previous_wait,
            repair=repair,
            # Read only where it can decide: from the fourth retry on.
            tool_answering=self._retries < RETRIES_WHILE_UNPROVEN or self._circuit.answering(),
        )

    def _report(self, report: Step[A], then: Step[A]) -> Step[A]:
        self._queue.append(then)
        return report

    def _settle(self, result: Result[A], last: Attempt) -> Settle:
        self._result = result
        if not last.verdict.is_failure or result.outcome in _SUCCEEDED:
            return SETTLE_OK
        return SETTLE_FAILED

    def _abandon(self) -> None:
        if self._ticket is not None:
            self._circuit.abandon(self._ticket)

    def _refused(self, open_for_s: float) -> Result[A]:
        """``CIRCUIT_OPEN`` before any attempt: the tool is not to be called for a while."""
        return Result(
            Outcome.UNREACHABLE, 0, self.trail, circuit_open_for_s=open_for_s, tool=self.terms.tool
        )

    def _ended(
        self, outcome: Outcome, last: Attempt, paused_for_s: float | None = None
    ) -> Result[A]:
        """The request's result; ``paused_for_s`` is how long the tool is not to be called,
        said as ``CIRCUIT_OPEN`` only when there is no answer of the tool's to give (the
        last one streamed on and is gone)."""
        answer, error = self._answer, last.error
        if paused_for_s is None or answer is not None or error is not None:
            paused_for_s, tool = None, ""
        else:
            tool = self.terms.tool
        reason = last.error_reason
        if outcome is Outcome.DEADLINE and error is AttemptError.TIMEOUT:
            reason = "deadline"  # the request's time ran out, not the tool's per-try
        return Result(
            outcome,
            self._attempts,
            tuple(self._trail),
            answer,
            error,
            reason,
            paused_for_s,
            tool,
            self._answered_layers,
        )


def _session_lost(attempt: Attempt) -> bool:
    """Whether ``attempt`` was answered as MCP answers a session it does not know: ``404``
    (a 2026-07-28 server's ``404`` for a method it lacks says ``-32601``)."""
    reply = attempt.reply
    if reply is None or reply.status != 404:
        return False
    return reply.failure is None or reply.failure.code != "-32601"
