"""The retry life of one request as a protocol: events in, commands out.

In the manner of h11's ``Connection`` and tenacity's ``BaseRetrying.iter()``: the engine
tells the machine what happened — an attempt's answer, a sleep done, the repair layers'
answer, the fleet's cooldown read, a hedge's timer, the agent's cancellation — and carries
out the command it answers with: send, hedge, wait, prepare, read the cooldown, ask for a
repair, open a session again, settle the circuit, or the result. What the machine only
tells (an attempt judged, a payload to use, a cooldown to share, a repair's fate, the
budget's or the circuit's refusal) goes to its outbox, which the engine drains before the
next command. Each command puts the machine in a phase, and each phase takes only its own
events (``phases``): an event out of turn is the sidecar's bug and raises.

Every rule of a request's retries is here or in the pure functions it calls (``judge``,
``decide``, ``policy``): the answer's verdict, the circuit's and the cooldowns' refusals,
the limits, the deadline, the budget, hedging, the trail. No I/O, no event loop; its
clocks are injected, so a whole request's life is one table row (tests/test_machine.py).

The machine owns the trail and the attempt records; each record, and the result, is
immutable once made. The tool's answer is read through ``Held``: the machine judges what
was read of it and decides when it is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic

from sidecar.outcomes import AttemptError, NoAnswer, Outcome, Wait
from sidecar.repair.payload import Payload
from sidecar.retry.attempt import judge
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
from sidecar.retry.phases import AWAITS, EVENTS, MachineEvent, OutOfTurn, Phase
from sidecar.retry.policy import RETRIES_WHILE_UNPROVEN, attempt_timeout_s, plan_cooldown
from sidecar.retry.replay import McpToolHints
from sidecar.retry.steps import (
    BUDGET_EXHAUSTED,
    CIRCUIT_REFUSED,
    PREPARE,
    READ_COOLDOWN,
    SETTLE_FAILED,
    SETTLE_OK,
    A,
    Attempt,
    AttemptJudged,
    Command,
    Paused,
    Relayed,
    ReopenSession,
    Repair,
    RepairJudged,
    Report,
    Result,
    Send,
    SendHedged,
    Settle,
    ShareCooldown,
    Terms,
    Unanswered,
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
    """One request's retry life. ``start`` gives the first command; each event method the
    next one, until a result."""

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
        "_phase",
        "_previous_wait",
        "_records",
        "_reopens_left",
        "_result",
        "_retries",
        "_sent",
        "_ticket",
        "_tools",
        "_trail",
        "_unjudged",
        "_unrun",
        "_wall",
        "outbox",
        "terms",
    )

    def __init__(
        self,
        terms: Terms,
        *,
        circuit: CircuitBreaker,
        budget: RetryBudget,
        clock: Callable[[], float],
        wall: Callable[[], float],
        tools: McpToolHints | None = None,
    ) -> None:
        self.terms = terms
        self._circuit, self._budget, self._clock, self._wall = circuit, budget, clock, wall
        self._tools = tools  # taught by a ``tools/list`` answer, when the call is one
        self._phase = Phase.NEW
        # What the machine tells with no answer owed, oldest first: the engine drains it
        # before it carries out the command that followed.
        self.outbox: list[Report] = []
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
        self._unrun = 0  # attempts a lost session's 404 proved never ran
        self._previous_wait: float | None = None
        self._result: Result[A] | None = None

    @property
    def phase(self) -> Phase:
        return self._phase

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

    def time_left_s(self) -> float:
        """What is left of the request's deadline: what an exchange of the sidecar's own
        for it (a stream's resumption) may take at most."""
        return self.terms.deadline - self._clock()

    # Events.

    def start(self) -> Command[A]:
        """The request arrived: is the tool to be called at all?"""
        self._expect(MachineEvent.START)
        self._budget.record_request()
        admitted = self._circuit.admit()
        if not isinstance(admitted, Ticket):
            self._trail.append("circuit_open")
            self.outbox.append(CIRCUIT_REFUSED)
            return self._give(self._refused(admitted))
        self._ticket = admitted
        return self._give(READ_COOLDOWN if self.terms.shares_cooldowns else PREPARE)

    def prepared(self, payload: Payload | None) -> Command[A]:
        """The payload that goes first: the agent's, coerced (``None``: streamed)."""
        self._expect(MachineEvent.PREPARED)
        if payload is not None:
            self._payload = payload
            self._sent.append(payload)
            # The agent's payload, coerced, awaits its answer as a repaired one does.
            self._unjudged = payload.layers[-1] if payload.layers else None
        return self._give(self._send())

    def cooldown_read(self, cooldown_s: float) -> Command[A]:
        """The fleet's cooldown of the tool (0: none): wait it out, or end when it is too
        long for this request."""
        self._expect(MachineEvent.COOLDOWN_READ)
        return self._give(self._after_cooldown(cooldown_s))

    def slept(self) -> Command[A]:
        """A wait ended: a retry's goes on to the retry, the fleet's cooldown is read again."""
        self._expect(MachineEvent.SLEPT)
        return self._give(READ_COOLDOWN if self._phase is Phase.COOLING_DOWN else self._gate())

    def hedge_due(self) -> Send | None:
        """The hedge's timer fired before any answer's head: a copy, when the budget pays."""
        self._expect(MachineEvent.HEDGE_DUE)
        if not self._budget.available():
            return None
        self._budget.spend()
        self._trail.append(f"hedge={seconds_token(self.terms.hedge_after_s)}")
        return self._copy(hedge=True)

    def answered(self, copy: Send, result: A | NoAnswer) -> Command[A]:
        """Attempt ``copy`` ended: the tool's answer (what was read of it), or none."""
        self._expect(MachineEvent.ANSWERED)
        attempt, answer = judge(copy, result, self.terms, self._tools, self._wall)
        self._records.append(attempt)
        outbox = self.outbox
        outbox.append(AttemptJudged(attempt, self._clock() - copy.started))
        if answer is not None:
            if self._answer is not None:
                self._answer.discard()
            self._answer = answer
            self._answered_layers = self._payload.layers if self._payload is not None else ()
        if self._unjudged is not None:
            judged = "succeeded" if attempt.verdict.success else "failed"
            outbox.append(RepairJudged(self._unjudged, judged))
            self._unjudged = None
        if self.terms.shares_cooldowns and attempt.requested_s is not None:
            # Only a failed answer's wait is read (``judge``).
            path = self.terms.path if attempt.path_scoped else None
            outbox.append(ShareCooldown(attempt.requested_s, path))
        return self._give(self._decide())

    def repaired(
        self, payload: Payload | None, layer: str | None, retry_same: bool, llm_repairs: int
    ) -> Command[A]:
        """The repair layers answered: a new ``payload`` from ``layer``, or none (the model
        may have judged the failure transient: ``retry_same``)."""
        self._expect(MachineEvent.REPAIRED)
        self._llm_repairs_left -= llm_repairs
        last = self._records[-1]
        answer = RepairAnswer(layer if payload is not None else None, retry_same)
        decision = decide(self._known(last, answer), self.terms.backoff)
        return self._give(self._carry_out(decision, payload))

    def reopened(self, opened: bool) -> Command[A]:
        """The MCP session the server forgot was ``opened`` again, or could not be: the
        request goes once more on the new session (the 404 proved it never ran), or its
        404 goes back as it came."""
        self._expect(MachineEvent.REOPENED)
        self._reopens_left = self._reopens_left - 1 if opened else 0
        if not opened:
            return self._give(self._decide())
        last = self._records[-1]
        self._unrun += 1
        self._trail.append(f"{last.trail_label} session=reopened")
        # A retry, as the agent reads the outcome (``recovered``); the budget, which bounds
        # what retries add to a failing tool's load, pays for none: the call never ran.
        self._retries += 1
        if self._answer is not None:
            self._answer.discard()
            self._answer = None
        return self._give(self._send())

    def settled(self) -> Result[A]:
        """The circuit counted the request's verdict."""
        self._expect(MachineEvent.SETTLED)
        assert self._result is not None
        self._phase = Phase.ENDED
        return self._result

    def cancelled(self) -> Result[A]:
        """The agent cancelled the request: the tool's last whole answer, else the sidecar's
        ``UPSTREAM_TIMEOUT`` (``reason: cancelled``). The circuit counts no verdict for it."""
        self._expect(MachineEvent.CANCELLED)
        self._phase = Phase.ENDED
        self._abandon()
        self._trail.append("stop=cancelled")
        answer = self._answer
        trail = self.trail
        if answer is not None and answer.complete:
            return Relayed(Outcome.DEADLINE, self._attempts, trail, answer, self._answered_layers)
        if answer is not None:
            answer.discard()  # an answer still streaming cannot wait to be relayed
        return Unanswered(
            Outcome.DEADLINE, self._attempts, trail, AttemptError.TIMEOUT, "cancelled"
        )

    def agent_gone(self) -> None:
        """The agent went away (or the engine failed): nothing goes back, and no verdict is
        counted. Once the result is given, its answer goes too: nobody will relay it."""
        self._expect(MachineEvent.AGENT_GONE)
        if self._phase is not Phase.ENDED:
            self._abandon()
        self._phase = Phase.ENDED
        if self._answer is not None:
            self._answer.discard()

    # The protocol.

    def _expect(self, event: MachineEvent) -> None:
        if event not in EVENTS[self._phase]:
            raise OutOfTurn(event, self._phase)

    def _give(self, command: Command[A]) -> Command[A]:
        """``command``, the machine now in the phase that waits for its answer."""
        self._phase = AWAITS[type(command)]
        return command

    # Rules.

    def _decide(self) -> Command[A]:
        last = self._records[-1]
        if (
            self._reopens_left
            and self.terms.session_reopenable
            and self._payload is not None  # a streamed body cannot go again
            and _session_lost(last)
            and self._clock() < self.terms.retry_until
        ):
            return ReopenSession(self.time_left_s())
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

    def _carry_out(self, decision: Decision, payload: Payload | None) -> Command[A]:
        last = self._records[-1]
        if isinstance(decision, Stop):
            label = last.trail_label
            self._trail.append(f"{label} {decision.note}" if decision.note else label)
            if decision.outcome is Outcome.BUDGET:
                self.outbox.append(BUDGET_EXHAUSTED)
            return self._settle(self._ended(decision.outcome, last), last)
        self._budget.spend()
        self._retries += 1
        if isinstance(decision, SendRepaired):
            assert payload is not None
            self._trail.append(f"{last.trail_label} repair={decision.layer}")
            self._unjudged = decision.layer
            self._payload = payload
            self._sent.append(payload)
            self.outbox.append(UsePayload(payload, decision.layer, self._attempts, last.label))
            return self._gate()
        assert isinstance(decision, Retry)
        return self._wait(decision.wait, last)

    def _after_cooldown(self, cooldown_s: float) -> Command[A]:
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
            return WaitCooldown(plan.seconds)
        self._trail.append(f"cooldown={seconds_token(cooldown_s)} stop={plan.value}")
        if not self._records:
            assert self._ticket is not None
            self._circuit.abandon(self._ticket)
            return self._refused(cooldown_s)
        last = self._records[-1]
        return self._settle(self._ended(plan, last, paused_for_s=cooldown_s), last)

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
        return WaitRetry(wait, self._attempts, last.label, reason, last.failure)

    def _gate(self) -> Command[A]:
        """Before a retry: the circuit may have opened meanwhile, the fleet may know a
        cooldown. When the circuit opened, what this request has is what it returns."""
        assert self._ticket is not None
        if not self._circuit.allows_more(self._ticket):
            self._trail.append("circuit_open")
            last = self._records[-1]
            ended = self._ended(last.stopped_outcome, last, self._circuit.open_for_s())
            return self._settle(ended, last)
        return READ_COOLDOWN if self.terms.shares_cooldowns else self._send()

    def _send(self) -> Send | SendHedged:
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
            # The call's first run: a lost session's 404s before it never ran.
            first=self._attempts - self._unrun == 1,
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

    def _settle(self, result: Result[A], last: Attempt) -> Settle:
        self._result = result
        if not last.verdict.is_failure or result.outcome in _SUCCEEDED:
            return SETTLE_OK
        return SETTLE_FAILED

    def _abandon(self) -> None:
        if self._ticket is not None:
            self._circuit.abandon(self._ticket)

    def _refused(self, open_for_s: float) -> Paused:
        """``CIRCUIT_OPEN`` before any attempt: the tool is not to be called for a while."""
        return Paused(Outcome.UNREACHABLE, 0, self.trail, open_for_s, self.terms.tool)

    def _ended(
        self, outcome: Outcome, last: Attempt, paused_for_s: float | None = None
    ) -> Result[A]:
        """The request's result: the tool's last answer, else what the last attempt ran
        into, else (the last answer streamed on and is gone) ``paused_for_s``, how long the
        tool is not to be called, said as ``CIRCUIT_OPEN``."""
        trail, answer, error = tuple(self._trail), self._answer, last.error
        if answer is not None:
            return Relayed(outcome, self._attempts, trail, answer, self._answered_layers)
        if error is not None:
            reason = last.error_reason
            if outcome is Outcome.DEADLINE and error is AttemptError.TIMEOUT:
                # The request's time ran out, not the tool's per-try: its deadline's, or
                # the retry window's for a retry.
                copy = last.copy
                to_deadline_s = self.terms.deadline - copy.started
                reason = "deadline" if copy.per_try_s >= to_deadline_s - 1e-6 else "retry_window"
            return Unanswered(outcome, self._attempts, trail, error, reason)
        # Only a wait drops an answer (one still streaming), and only a refusal follows it.
        assert paused_for_s is not None
        return Paused(outcome, self._attempts, trail, paused_for_s, self.terms.tool)


def _session_lost(attempt: Attempt) -> bool:
    """Whether ``attempt`` was answered as MCP answers a session it does not know: ``404``
    (a 2026-07-28 server's ``404`` for a method it lacks says ``-32601``)."""
    reply = attempt.reply
    if reply is None or reply.status != 404:
        return False
    return reply.failure is None or reply.failure.code != "-32601"
