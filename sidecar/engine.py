"""The retry loop: attempt, classify, decide, wait — until an answer can go back.

Every rule lives elsewhere (``classify``, ``policy``, ``budget``, ``circuit``, ``waits``);
this module only sequences them, keeps the last real answer, and reports each stage
through ``Hooks``. It never invents an answer: when it stops, the agent gets the tool's
last real one, or — only when none exists — the sidecar's own error envelope.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import aiohttp

from sidecar.budget import RetryBudget
from sidecar.circuit import CircuitBreaker
from sidecar.classify import Action, Reply, Verdict, classify
from sidecar.controls import RequestControls
from sidecar.envelopes import inspect
from sidecar.errors import AttemptError
from sidecar.ids import idempotency_key
from sidecar.observe import Hooks
from sidecar.policy import Backoff, Limits, Stop, Wait, plan_wait
from sidecar.repair.payload import Payload
from sidecar.repair.pipeline import Proposal, RepairJob, Repairs
from sidecar.settings import RouteConfig
from sidecar.upstream import Answer, UpstreamRequest, exchange
from sidecar.waits import requested_wait

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


@dataclass(slots=True)
class RouteGuards:
    """What a route remembers across requests."""

    budget: RetryBudget
    circuit: CircuitBreaker
    backoff: Backoff


@dataclass(slots=True)
class Result:
    """What goes back to the agent, and how it came to be."""

    outcome: str
    attempts: int
    trail: list[str]
    answer: Answer | None = None  # the tool's last real answer, when one exists
    error: AttemptError | None = None  # else: what the last attempt ran into
    circuit_open_for_s: float | None = None  # else: the circuit refused to try at all
    repaired: tuple[str, ...] = ()  # the layers that changed the body behind ``answer``


@dataclass(slots=True)
class _Attempt:
    """One attempt's result as the loop reasons about it."""

    result: Answer | AttemptError
    verdict: Verdict
    reply: Reply | None = None
    label: str = field(init=False)
    cut_by_deadline: bool = False  # its timeout was the deadline's, not the per-try one

    def __post_init__(self) -> None:
        result = self.result
        self.label = result.value if isinstance(result, AttemptError) else str(result.status)


class Engine:
    """What every request shares: the upstream pool, each route's guards, the repairs."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        hooks: Hooks,
        routes: list[RouteConfig],
        repairs: Repairs,
        *,
        inspect_limit: int,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self.session = session
        self.hooks = hooks
        self.repairs = repairs
        self.inspect_limit = inspect_limit
        self.sleep = sleep
        self.clock = clock
        self.guards = {
            route.name: RouteGuards(
                budget=RetryBudget(
                    route.tuning.retry_budget_ratio, route.tuning.retry_budget_min_per_s, clock
                ),
                circuit=CircuitBreaker(
                    route.tuning.circuit_failures, route.tuning.circuit_open_ms / 1000, clock
                ),
                backoff=Backoff(
                    base_s=route.tuning.backoff_base_ms / 1000,
                    cap_s=route.tuning.backoff_max_ms / 1000,
                    multiplier=route.tuning.backoff_multiplier,
                    jitter=route.tuning.backoff_jitter,
                ),
            )
            for route in routes
        }

    async def run(
        self,
        route: RouteConfig,
        request: UpstreamRequest,
        controls: RequestControls,
        payload: Payload | None,
    ) -> Result:
        """Send ``request`` until an answer can go back.

        ``payload`` is the buffered body, which may be replayed and repaired; ``None`` means
        the body streams through and the request is tried once.
        """
        return await _Run(self, route, request, controls, payload).run()

    def judge(self, result: Answer | AttemptError, retry_on_status: frozenset[int]) -> _Attempt:
        """Read one attempt's answer (its envelope, when its body was read) into a verdict."""
        if isinstance(result, AttemptError):
            return _Attempt(result, classify(result, retry_on_status))
        response = result.response
        failure, text = (
            inspect(
                result.status,
                response.content_type,
                response.headers.get("Content-Encoding"),
                result.body,
            )
            if result.decisive
            else (None, "")
        )
        reply = Reply(result.status, failure, text)
        return _Attempt(result, classify(reply, retry_on_status), reply)


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
        self.path = request.url.path
        # The sidecar's own idempotency header; "" when it is off or the agent sent a key.
        header = self.tuning.idempotency_header
        self.own_key = "" if header in request.headers else header
        self.request = request
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

    async def run(self) -> Result:
        self.guards.budget.record_request()
        self._prepare()
        try:
            while True:
                refused = self._refused_by_circuit()
                if refused is not None:
                    return refused
                attempt = await self._attempt()
                step = await self._next_step(attempt)
                if isinstance(step, Result):
                    return step
                if isinstance(step, Wait):
                    await self.engine.sleep(step.seconds)
        except asyncio.CancelledError:
            # The agent went away during an attempt, a repair or a wait.
            if self.last_answer is not None:
                self.last_answer.discard()
            raise

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
        self.request = _sending(self.request, payload, self.own_key)

    def _refused_by_circuit(self) -> Result | None:
        refused_for = self.guards.circuit.admit()
        self.hooks.circuit_state(self.route.name, self.guards.circuit.state)
        if refused_for is None:
            return None
        self.trail.append("circuit_open")
        if self.last_answer is not None:
            return self._result(Stop.EXHAUSTED.value, None)
        return Result("unreachable", self.attempts, self.trail, circuit_open_for_s=refused_for)

    async def _attempt(self) -> _Attempt:
        """Send the request once, read what matters of the answer, and judge it."""
        self.attempts += 1
        per_try = min(self.tuning.per_try_timeout_ms / 1000, self.deadline - self.clock())
        started = self.clock()
        try:
            result = await exchange(
                self.engine.session, self.request, per_try, self.engine.inspect_limit
            )
        except asyncio.CancelledError:
            self.guards.circuit.abandon()
            raise
        attempt = self.engine.judge(result, self.tuning.retry_on_status)
        attempt.cut_by_deadline = per_try < self.tuning.per_try_timeout_ms / 1000
        self.guards.circuit.record(attempt.verdict.is_failure)
        self.hooks.circuit_state(self.route.name, self.guards.circuit.state)
        self.hooks.attempt_finished(
            self.route.name,
            self.attempts,
            attempt.label,
            self.clock() - started,
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
        return attempt

    async def _next_step(self, attempt: _Attempt) -> Result | Wait | None:
        """What follows an attempt: a result to return, a wait, or (``None``) a repaired
        payload to send at once."""
        verdict = attempt.verdict
        if verdict.action is Action.DONE:
            if verdict.success:
                return self._stop("ok" if self.attempts == 1 else "recovered", attempt)
            return self._stop(Stop.NOT_RETRYABLE, attempt)
        if attempt.result is AttemptError.TIMEOUT and attempt.cut_by_deadline:
            return self._stop(Stop.DEADLINE, attempt, "stop=deadline")
        if self.payload is None:
            return self._stop(Stop.NOT_RETRYABLE, attempt, "stop=not_replayable")
        if verdict.action is Action.REPAIR:
            proposal = await self._repair(attempt)
            if proposal.payload is not None and proposal.layer is not None:
                return self._send_repaired(attempt, proposal.payload, proposal.layer)
            if not proposal.retry_same:
                return self._stop(Stop.NOT_RETRYABLE, attempt, "repair=none")
        return self._wait_for_same(attempt)

    async def _repair(self, attempt: _Attempt) -> Proposal:
        assert attempt.reply is not None and self.payload is not None
        proposal = await self.engine.repairs.propose(
            RepairJob(
                route=self.route.name,
                method=self.request.method,
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
        self.llm_repairs_left -= proposal.llm_repairs
        return proposal

    def _send_repaired(self, attempt: _Attempt, payload: Payload, layer: str) -> Result | None:
        """Send a repaired payload next, at once, if the limits allow another attempt."""
        if self.retries >= self.limits.max_retries:
            stopped = Stop.EXHAUSTED
        elif self.deadline - self.clock() <= 0:
            stopped = Stop.DEADLINE
        elif not self.guards.budget.try_spend():
            self.hooks.budget_exhausted(self.route.name)
            stopped = Stop.BUDGET
        else:
            self.hooks.repaired_retry(self.route.name, self.attempts, attempt.label, layer)
            self.trail.append(f"{attempt.label} repair={layer}")
            self.unjudged_layer = layer
            self._send_next(payload)
            self.retries += 1
            return None
        return self._stop(stopped, attempt, f"stop={stopped.value}")

    def _wait_for_same(self, attempt: _Attempt) -> Result | Wait:
        """The wait before sending the same payload again, or why it will not be sent."""
        plan = plan_wait(
            retries_done=self.retries,
            limits=self.limits,
            requested_s=_requested_wait(attempt),
            backoff=self.guards.backoff,
            previous_s=self.previous_wait,
            time_left_s=self.deadline - self.clock(),
            unreachable=attempt.result is AttemptError.CONNECT,
        )
        if isinstance(plan, Wait) and not self.guards.budget.try_spend():
            self.hooks.budget_exhausted(self.route.name)
            plan = Stop.BUDGET
        if isinstance(plan, Stop):
            return self._stop(plan, attempt, f"stop={plan.value}")
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
            plan,
            attempt.reply.failure if attempt.reply else None,
        )
        self.trail.append(f"{attempt.label} {plan.source}={_seconds(plan.seconds)}")
        self.retries += 1
        self.previous_wait = plan.seconds
        return plan

    def _stop(self, reason: Stop | str, attempt: _Attempt, note: str | None = None) -> Result:
        self.trail.append(f"{attempt.label} {note}" if note else attempt.label)
        error = attempt.result if isinstance(attempt.result, AttemptError) else None
        return self._result(reason.value if isinstance(reason, Stop) else reason, error)

    def _result(self, outcome: str, error: AttemptError | None) -> Result:
        layers = self.answered_payload.layers if self.answered_payload is not None else ()
        return Result(outcome, self.attempts, self.trail, self.last_answer, error, repaired=layers)


def _requested_wait(attempt: _Attempt) -> float | None:
    if not isinstance(attempt.result, Answer) or attempt.reply is None:
        return None
    return requested_wait(attempt.result.response.headers, attempt.reply.failure, time.time())


def _sending(request: UpstreamRequest, payload: Payload, key_header: str) -> UpstreamRequest:
    """``request`` carrying ``payload``, under a fresh idempotency key when it is the sidecar's.

    The sidecar's key names one payload: every retry of it carries the same key, and a
    repaired payload (a different request to the tool) gets a new one. A key the agent
    chose is the agent's to keep.
    """
    headers = request.headers
    if key_header:
        headers = headers.copy()
        headers[key_header] = idempotency_key()
    return replace(request, headers=headers, body=payload.body)


def _seconds(value: float) -> str:
    """Short seconds for the trail, three significant digits: ``0.8s``, ``2s``, ``0.0163s``."""
    return f"{value:.3g}s"
