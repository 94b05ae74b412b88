"""The retry loop: attempt, judge, decide, wait or repair — until an answer can go back.

Every rule lives elsewhere (``decide``, ``classify``, ``policy``, ``guards``, ``waits``);
this module does the I/O they call for, keeps the last real answer, and reports each
stage through ``Hooks``. It never invents an answer: when it stops, the agent gets the tool's
last real one, or — only when none exists — the sidecar's own error envelope.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from sidecar.config import RouteConfig
from sidecar.ids import idempotency_key
from sidecar.outcomes import AttemptError, Outcome, Wait
from sidecar.repair.payload import Payload
from sidecar.repair.pipeline import Proposal, RepairJob, Repairs
from sidecar.retry import cooldowns
from sidecar.retry.attempt import Attempt, Result, carrying, judge, seconds_token
from sidecar.retry.call import describe
from sidecar.retry.cancel import cancelled, unless_stopped
from sidecar.retry.classify import Action
from sidecar.retry.controls import RequestControls
from sidecar.retry.decide import (
    AfterAttempt,
    AskRepair,
    RepairAnswer,
    Retry,
    SendRepaired,
    Stop,
    decide,
)
from sidecar.retry.guards.circuit import Ticket
from sidecar.retry.guards.fleet import StateStore
from sidecar.retry.guards.route import RouteGuards
from sidecar.retry.hedge import Copy, Hedging
from sidecar.retry.policy import Limits, attempt_timeout_s
from sidecar.telemetry import Hooks
from sidecar.transport.exchange import Answer, UpstreamRequest, read_for_decision, send
from sidecar.transport.pool import Pool, Response

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class Engine:
    """What every request shares: the upstream pool, each route's guards, the repairs."""

    def __init__(
        self,
        pool: Pool,
        hooks: Hooks,
        routes: Sequence[RouteConfig],
        repairs: Repairs,
        *,
        inspect_limit: int,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        state: StateStore | None = None,
    ) -> None:
        self.pool = pool
        self.hooks = hooks
        self.repairs = repairs
        self.inspect_limit = inspect_limit
        self.sleep = sleep
        self.clock = clock
        self.guards = {route.name: RouteGuards.for_route(route, clock, state) for route in routes}

    async def run(
        self,
        route: RouteConfig,
        request: UpstreamRequest,
        controls: RequestControls,
        payload: Payload | None,
        stop: asyncio.Event | None = None,
    ) -> Result:
        """Send ``request`` until an answer can go back, or the agent cancels it (``stop``).

        ``payload`` is the buffered body, which may be replayed and repaired; ``None`` means
        the body streams through and the request is tried once.
        """
        return await _Run(self, route, request, controls, payload).run(stop)


class _Run:
    """One request's way through the loop, and the state each step reads and updates."""

    def __init__(
        self,
        engine: Engine,
        route: RouteConfig,
        request: UpstreamRequest,
        controls: RequestControls,
        payload: Payload | None,
    ) -> None:
        self.engine = engine
        self.hooks = engine.hooks
        self.clock = engine.clock
        self.route = route
        self.tuning = route.tuning
        self.guards = engine.guards[route.name]
        self.controls = controls
        self.limits = Limits(controls.max_retries, self.tuning.max_retry_after_ms / 1000)
        self.deadline = self.clock() + controls.timeout_s
        call = describe(route, request, payload, self.guards, engine.repairs.path_template)
        self.path, self.rpc, self.own_key = call.path, call.rpc, call.own_key
        self.safe_to_repeat = call.safe_to_repeat
        self.replay_safe = self.tuning.replay_delivered == "always" or call.safe_to_repeat
        self.tool, self.tool_guards = self.guards.tool(call.tool)
        self.request = call.request
        self.payload = payload
        self.sent_payloads: list[Payload] = []
        self.unjudged_layer: str | None = None  # the repair whose payload awaits its answer
        self.llm_repairs_left = self.tuning.llm_max_repairs
        self.trail: list[str] = []
        self.last_answer: Answer | None = None
        self.answered_payload: Payload | None = None
        self.attempts = 0
        self.retries = 0
        self.previous_wait: float | None = None
        self.hedging = self._hedging() if self.tuning.hedge_after_ms else None

    def _hedging(self) -> Hedging | None:
        """Hedged attempts, for a call that is safe to run twice and whose body is held."""
        if not self.safe_to_repeat or self.payload is None:
            return None
        return Hedging(
            self._start_copy,
            self.engine.pool,
            after_s=self.tuning.hedge_after_ms / 1000,
            budget=self.guards.budget,
            hooks=self.hooks,
            route=self.route.name,
            clock=self.clock,
            trail=self.trail,
        )

    async def run(self, stop: asyncio.Event | None) -> Result:
        self.guards.budget.record_request()
        circuit = self.tool_guards.circuit
        admitted = circuit.admit()
        self.hooks.circuit_state(self.route.name, circuit.state, self.tool)
        if not isinstance(admitted, Ticket):
            self.hooks.circuit_refused(self.route.name, self.tool)
            self.trail.append("circuit_open")
            return self._refused(admitted)
        try:
            refused = await self._wait_out_cooldown(None)
            if refused is not None:
                circuit.abandon(admitted)
                return refused
            self._prepare()
            ended = await unless_stopped(self._loop(admitted), stop)
        except asyncio.CancelledError:
            # The agent went away during an attempt, a repair or a wait.
            circuit.abandon(admitted)
            if self.last_answer is not None:
                self.last_answer.discard()
            raise
        if ended is None:  # the agent cancelled it: no verdict on the tool
            return cancelled(circuit, admitted, self.attempts, self.trail, self.last_answer)
        result, last = ended
        failed = last.verdict.is_failure and result.outcome not in (Outcome.OK, Outcome.RECOVERED)
        await self.tool_guards.record(admitted, failed, self.tuning.circuit_window_ms / 1000)
        self.hooks.circuit_state(self.route.name, circuit.state, self.tool)
        return result

    def _refused(self, open_for_s: float) -> Result:
        """``CIRCUIT_OPEN`` before any attempt: the tool is not to be called for a while."""
        return Result(
            Outcome.UNREACHABLE, 0, self.trail, circuit_open_for_s=open_for_s, tool=self.tool
        )

    async def _wait_out_cooldown(self, last: Attempt | None) -> Result | None:
        """Wait until the fleet's cooldown of the tool ends, before the next attempt.

        When the request cannot wait that long, a result: the tool's last answer, or, before
        any attempt, ``CIRCUIT_OPEN`` with the time left.
        """
        fleet = self.tool_guards.fleet
        if fleet is None:
            return None
        stopped = await cooldowns.wait_out(
            fleet,
            self.path,
            limits=self.limits,
            backoff=self.guards.backoff,
            time_left_s=lambda: self.deadline - self.clock(),
            sleep=self.engine.sleep,
            trail=self.trail,
        )
        if stopped is None:
            return None
        cooldown_s, outcome = stopped
        if last is None:
            return self._refused(cooldown_s)
        return self._result(outcome, last, paused_for_s=cooldown_s)

    async def _loop(self, ticket: Ticket) -> tuple[Result, Attempt]:
        """Attempts until one step ends the request; the result and the last attempt."""
        while True:
            attempt = await self._attempt()
            step = await self._next_step(attempt)
            if isinstance(step, Result):
                return step, attempt
            if isinstance(step, Wait):
                await self.engine.sleep(step.seconds)
            circuit = self.tool_guards.circuit
            if not circuit.allows_more(ticket):
                # The circuit opened meanwhile: what this request has is what it returns.
                self.trail.append("circuit_open")
                open_for_s = circuit.open_for_s()
                return self._result(attempt.stopped_outcome, attempt, open_for_s), attempt
            refused = await self._wait_out_cooldown(attempt)
            if refused is not None:
                return refused, attempt

    def _prepare(self) -> None:
        """Coerce the agent's payload before the first attempt; put the idempotency key on."""
        payload = self.payload
        if payload is None:
            if self.own_key:
                self.request = replace(self.request, headers=self.request.headers.copy())
                self.request.headers[self.own_key] = idempotency_key()
            return
        payload = self.engine.repairs.prepare(
            self.route.name, self.request.method, self.path, payload, self.controls.repair
        )
        if payload.layers:
            self.hooks.repair_result(self.route.name, "coercion", "applied")
            self.unjudged_layer = payload.layers[-1]
        self._send_next(payload)

    def _send_next(self, payload: Payload) -> None:
        """Make ``payload`` the body of the next attempts (a new payload, a new key)."""
        self.payload = payload
        self.sent_payloads.append(payload)
        self.request = carrying(self.request, payload, self.own_key)

    async def _attempt(self) -> Attempt:
        """Send the request (hedged when it may be), read what matters of the answer that
        came first, and judge it."""
        if self.hedging is not None:
            copy, sent = await self.hedging.send()
        else:
            copy, request = self._start_copy()
            sent = await send(self.engine.pool, request, copy.per_try_s)
        result = (
            await read_for_decision(
                self.request,
                sent,
                self.engine.inspect_limit,
                self.tuning.inspect_timeout_ms / 1000,
            )
            if isinstance(sent, Response)
            else sent
        )
        attempt = judge(result, self.tuning.retry_on_status)
        attempt.cut_by_deadline = copy.per_try_s < self.tuning.per_try_timeout_ms / 1000
        if self.rpc is not None and self.rpc[0] == "tools/list" and attempt.verdict.success:
            # Which tools a relayed ``tools/list`` result marks safe to repeat.
            assert isinstance(result, Answer)
            self.guards.mcp_tools.learn(result.document())
        self.hooks.attempt_finished(
            self.route.name,
            copy.number,
            attempt.label,
            self.clock() - copy.started,
            attempt.reply.failure if attempt.reply else None,
        )
        if self.unjudged_layer is not None:
            judged = "succeeded" if attempt.verdict.success else "failed"
            self.hooks.repair_result(self.route.name, self.unjudged_layer, judged)
            self.unjudged_layer = None
        if isinstance(result, Answer):
            if self.last_answer is not None:
                self.last_answer.discard()
            self.last_answer, self.answered_payload = result, self.payload
        if not attempt.verdict.success:
            await cooldowns.learn_requested_wait(attempt, self.tool_guards.fleet, self.path)
        return attempt

    def _start_copy(self, hedge: bool = False) -> tuple[Copy, UpstreamRequest]:
        """A new attempt's record, and its request as it must go upstream."""
        self.attempts += 1
        per_try = attempt_timeout_s(
            self.tuning.per_try_timeout_ms / 1000,
            self.deadline - self.clock(),
            first=self.attempts == 1,
            agent_deadline=self.controls.agent_deadline,
        )
        request = self.hooks.attempt_started(self.attempts, self.request, hedge=hedge)
        return Copy(self.attempts, self.clock(), per_try, hedge), request

    async def _next_step(self, attempt: Attempt) -> Result | Wait | None:
        """What follows an attempt: a result to return, a wait, or (``None``) a repaired
        payload to send at once. ``decide`` says which; this carries it out."""
        decision = decide(self._known_after(attempt), self.guards.backoff)
        proposal = None
        if isinstance(decision, AskRepair):
            proposal = await self._repair(attempt)
            repaired = proposal.layer if proposal.payload is not None else None
            answer = RepairAnswer(repaired, proposal.retry_same)
            decision = decide(self._known_after(attempt, answer), self.guards.backoff)
        if isinstance(decision, Stop):
            if decision.outcome is Outcome.BUDGET:
                self.hooks.budget_exhausted(self.route.name)
            return self._stop(decision.outcome, attempt, decision.note)
        self.guards.budget.spend()
        self.retries += 1
        if isinstance(decision, SendRepaired):
            assert proposal is not None and proposal.payload is not None
            self.hooks.repaired_retry(self.route.name, self.attempts, attempt.label, decision.layer)
            self.trail.append(f"{attempt.label} repair={decision.layer}")
            self.unjudged_layer = decision.layer
            self._send_next(proposal.payload)
            return None
        assert isinstance(decision, Retry)
        return self._wait_for_same(attempt, decision.wait)

    def _known_after(self, attempt: Attempt, repair: RepairAnswer | None = None) -> AfterAttempt:
        """What the decision after ``attempt`` needs to know, as of now."""
        result, verdict = attempt.result, attempt.verdict
        return AfterAttempt(
            verdict=verdict,
            retries=self.retries,
            limits=self.limits,
            time_left_s=self.deadline - self.clock(),
            # Summing the budget's window costs a few µs: looked at only when the verdict
            # leaves a retry open (``decide`` reads it for nothing else).
            budget_left=verdict.action is not Action.DONE and self.guards.budget.available(),
            replayable=self.payload is not None,
            safe_to_repeat=self.replay_safe,
            cut_by_deadline=attempt.cut_by_deadline,
            slow_body=isinstance(result, Answer) and result.slow,
            not_connected=isinstance(result, AttemptError) and result.not_connected,
            requested_s=attempt.requested_s,
            previous_wait_s=self.previous_wait,
            repair=repair,
        )

    async def _repair(self, attempt: Attempt) -> Proposal:
        assert attempt.reply is not None and self.payload is not None
        self.hooks.repair_started(self.route.name)
        proposal = await self.engine.repairs.propose(
            RepairJob(
                route=self.route.name,
                request=self.request,
                path=self.path,
                payload=self.payload,
                reply=attempt.reply,
                attempt=self.attempts,
                level=self.controls.repair,
                intent=self.controls.intent,
                tried={sent.fingerprint for sent in self.sent_payloads},
                llm_repairs_left=self.llm_repairs_left,
                time_left_s=self.deadline - self.clock(),
            )
        )
        self.hooks.repair_finished(self.route.name, proposal.layer)
        self.llm_repairs_left -= proposal.llm_repairs
        return proposal

    def _wait_for_same(self, attempt: Attempt, wait: Wait) -> Wait:
        """Get ready to send the same payload again after ``wait``."""
        if self.last_answer is not None and not self.last_answer.complete:
            # An answer still streaming holds a connection; it cannot wait for us.
            self.last_answer.discard()
            self.last_answer = None
        verdict = attempt.verdict
        self.hooks.retry_scheduled(
            self.route.name,
            self.attempts,
            attempt.label,
            verdict.reason if verdict.action is Action.RETRY else "server_error",
            wait,
            attempt.reply.failure if attempt.reply else None,
        )
        self.trail.append(f"{attempt.label} {wait.source}={seconds_token(wait.seconds)}")
        self.previous_wait = wait.seconds
        return wait

    def _stop(self, outcome: Outcome, attempt: Attempt, note: str | None = None) -> Result:
        self.trail.append(f"{attempt.label} {note}" if note else attempt.label)
        return self._result(outcome, attempt)

    def _result(self, outcome: Outcome, last: Attempt, paused_for_s: float | None = None) -> Result:
        """The request's result; ``paused_for_s`` is how long the tool is not to be called,
        said as ``CIRCUIT_OPEN`` only when there is no answer of the tool's to give (the
        last one streamed on and is gone)."""
        error = last.result if isinstance(last.result, AttemptError) else None
        layers = self.answered_payload.layers if self.answered_payload is not None else ()
        result = Result(outcome, self.attempts, self.trail, self.last_answer, error)
        result.error_reason, result.repaired = last.error_reason, layers
        if paused_for_s is not None and self.last_answer is None and error is None:
            result.circuit_open_for_s, result.tool = paused_for_s, self.tool
        return result
