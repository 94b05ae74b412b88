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

from sidecar.config import RouteConfig
from sidecar.errors import AttemptError
from sidecar.ids import idempotency_key
from sidecar.repair.payload import Payload
from sidecar.repair.pipeline import Proposal, RepairJob, Repairs
from sidecar.retry.classify import Action, Reply, Verdict, classify
from sidecar.retry.controls import RequestControls
from sidecar.retry.guards.budget import RetryBudget
from sidecar.retry.guards.circuit import CircuitBreaker, CircuitState, Ticket
from sidecar.retry.guards.fleet import RouteState, StateStore
from sidecar.retry.policy import Backoff, Limits, Outcome, Wait, plan_cooldown, plan_wait
from sidecar.retry.replay import McpToolHints, mcp_call, safe_to_repeat
from sidecar.retry.waits import requested_wait
from sidecar.telemetry import Hooks
from sidecar.tool.envelopes import inspect, json_document
from sidecar.transport.pool import Pool
from sidecar.transport.upstream import Answer, Malformed, UpstreamRequest, exchange

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


@dataclass(slots=True)
class RouteGuards:
    """What a route remembers across requests."""

    budget: RetryBudget
    circuit: CircuitBreaker
    backoff: Backoff
    mcp_tools: McpToolHints
    fleet: RouteState | None = None  # what the route shares with its replicas, when it does

    @classmethod
    def for_route(
        cls, route: RouteConfig, clock: Clock, fleet: RouteState | None = None
    ) -> RouteGuards:
        tuning = route.tuning
        return cls(
            budget=RetryBudget(tuning.retry_budget_ratio, tuning.retry_budget_min_per_s, clock),
            circuit=CircuitBreaker(
                min_failures=tuning.circuit_failures,
                failure_rate=tuning.circuit_failure_rate,
                window_s=tuning.circuit_window_ms / 1000,
                open_s=tuning.circuit_open_ms / 1000,
                probes=tuning.circuit_half_open_probes,
                clock=clock,
            ),
            backoff=Backoff(
                base_s=tuning.backoff_base_ms / 1000,
                cap_s=tuning.backoff_max_ms / 1000,
                multiplier=tuning.backoff_multiplier,
                jitter=tuning.backoff_jitter,
            ),
            mcp_tools=McpToolHints(),
            fleet=fleet,
        )


@dataclass(slots=True)
class Result:
    """What goes back to the agent, and how it came to be."""

    outcome: Outcome
    attempts: int
    trail: list[str]
    answer: Answer | None = None  # the tool's last real answer, when one exists
    error: AttemptError | None = None  # else: what the last attempt ran into
    error_reason: str | None = None  # ... in more words, when there are more to say
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
    requested_s: float | None = None  # the wait the tool asked for
    path_scoped: bool = False  # ... for the called path only (its envelope said so)
    error_reason: str | None = None  # why an answer was refused as malformed

    def __post_init__(self) -> None:
        result = self.result
        self.label = result.value if isinstance(result, AttemptError) else str(result.status)


class Engine:
    """What every request shares: the upstream pool, each route's guards, the repairs."""

    def __init__(
        self,
        pool: Pool,
        hooks: Hooks,
        routes: list[RouteConfig],
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
        self.guards = {
            route.name: RouteGuards.for_route(
                route, clock, state.for_route(route) if state is not None else None
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

    def judge(
        self, result: Answer | AttemptError | Malformed, retry_on_status: frozenset[int]
    ) -> _Attempt:
        """Read one attempt's answer (its envelope, when its body was read) into a verdict."""
        if isinstance(result, Malformed):
            error = AttemptError.MALFORMED
            return _Attempt(error, classify(error, retry_on_status), error_reason=result.reason)
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
        verdict = classify(reply, retry_on_status)
        if result.slow:
            # The tool answered; only its body is slow. Sending the call again could run
            # it twice, so this answer is the one the agent gets.
            verdict = replace(verdict, action=Action.DONE)
        return _Attempt(result, verdict, reply)


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
        # JSON-RPC method and tool of the call, when it is one (MCP speaks JSON-RPC).
        self.rpc = mcp_call(payload.body) if payload is not None else None
        self.replay_safe = self.tuning.replay_delivered == "always" or safe_to_repeat(
            request.method,
            request.headers,
            key_header=header,
            route_idempotent=route.idempotent,
            mcp_tool_safe=self.rpc is not None
            and self.rpc[0] == "tools/call"
            and self.guards.mcp_tools.is_safe(self.rpc[1]),
        )
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
        admitted = self.guards.circuit.admit()
        self.hooks.circuit_state(self.route.name, self.guards.circuit.state)
        if not isinstance(admitted, Ticket):
            self.hooks.circuit_refused(self.route.name)
            self.trail.append("circuit_open")
            return Result(Outcome.UNREACHABLE, 0, self.trail, circuit_open_for_s=admitted)
        try:
            refused = await self._wait_out_cooldown(None)
            if refused is not None:
                self.guards.circuit.abandon(admitted)
                return refused
            self._prepare()
            result, last = await self._loop(admitted)
        except asyncio.CancelledError:
            # The agent went away during an attempt, a repair or a wait.
            self.guards.circuit.abandon(admitted)
            if self.last_answer is not None:
                self.last_answer.discard()
            raise
        failed = last.verdict.is_failure and result.outcome not in (Outcome.OK, Outcome.RECOVERED)
        await self._record(admitted, failed)
        return result

    async def _record(self, ticket: Ticket, failed: bool) -> None:
        """The request's verdict into the circuit: the fleet's window when the route shares
        one (the process's own when the store cannot answer); an opening circuit is
        published as a cooldown."""
        circuit, fleet = self.guards.circuit, self.guards.fleet
        window_s = self.tuning.circuit_window_ms / 1000
        totals = None
        if fleet is not None and circuit.counts(ticket):
            totals = await fleet.count(failed, window_s)
        was_open = circuit.state is CircuitState.OPEN
        circuit.record(ticket, failed, totals)
        self.hooks.circuit_state(self.route.name, circuit.state)
        if fleet is not None and circuit.state is CircuitState.OPEN and not was_open:
            await fleet.publish_open(circuit.open_for_s(), window_s)

    async def _wait_out_cooldown(self, last: _Attempt | None) -> Result | None:
        """Wait until the fleet's cooldown of the tool ends, before the next attempt.

        When the request cannot wait that long, a result: the tool's last answer, or, before
        any attempt, ``CIRCUIT_OPEN`` with the time left.
        """
        fleet = self.guards.fleet
        if fleet is None:
            return None
        # Looked up again after each wait: while this request slept, the tool may have
        # started a new cooldown that another replica has published.
        while (cooldown_s := await fleet.cooldown_s(self.path)) > 0:
            plan = plan_cooldown(
                cooldown_s=cooldown_s,
                limits=self.limits,
                backoff=self.guards.backoff,
                time_left_s=self.deadline - self.clock(),
            )
            if isinstance(plan, Outcome):
                break
            self.trail.append(f"{plan.source}={_seconds(plan.seconds)}")
            await self.engine.sleep(plan.seconds)
        else:
            return None
        self.trail.append(f"cooldown={_seconds(cooldown_s)} stop={plan.value}")
        if last is None:
            return Result(Outcome.UNREACHABLE, 0, self.trail, circuit_open_for_s=cooldown_s)
        return self._result(plan, last, paused_for_s=cooldown_s)

    async def _loop(self, ticket: Ticket) -> tuple[Result, _Attempt]:
        """Attempts until one step ends the request; the result and the last attempt."""
        while True:
            attempt = await self._attempt()
            step = await self._next_step(attempt)
            if isinstance(step, Result):
                return step, attempt
            if isinstance(step, Wait):
                await self.engine.sleep(step.seconds)
            if not self.guards.circuit.allows_more(ticket):
                # The circuit opened meanwhile: what this request has is what it returns.
                self.trail.append("circuit_open")
                open_for_s = self.guards.circuit.open_for_s()
                return self._result(_stopped_by(attempt), attempt, open_for_s), attempt
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
        self.request = _sending(self.request, payload, self.own_key)

    async def _attempt(self) -> _Attempt:
        """Send the request once, read what matters of the answer, and judge it."""
        self.attempts += 1
        per_try = min(self.tuning.per_try_timeout_ms / 1000, self.deadline - self.clock())
        request = self.hooks.attempt_started(self.attempts, self.request)
        started = self.clock()
        result = await exchange(
            self.engine.pool,
            request,
            per_try,
            self.engine.inspect_limit,
            self.tuning.inspect_timeout_ms / 1000,
        )
        attempt = self.engine.judge(result, self.tuning.retry_on_status)
        attempt.cut_by_deadline = per_try < self.tuning.per_try_timeout_ms / 1000
        if self.rpc is not None and self.rpc[0] == "tools/list" and attempt.verdict.success:
            self._learn_tool_hints(attempt)
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
        if not attempt.verdict.success:
            await self._learn_requested_wait(attempt)
        return attempt

    async def _learn_requested_wait(self, attempt: _Attempt) -> None:
        """Read the wait a failed attempt's answer asks for; tell the fleet when it shares.

        A header's wait (``Retry-After``, ``RateLimit-Reset``) is the tool's word on the
        whole route; a wait in the envelope answers this call, so it holds for its path.
        """
        if not isinstance(attempt.result, Answer) or attempt.reply is None:
            return
        headers, failure, now = attempt.result.response.headers, attempt.reply.failure, time.time()
        attempt.requested_s = requested_wait(headers, None, now)
        if attempt.requested_s is None and failure is not None:
            attempt.requested_s = requested_wait({}, failure, now)
            attempt.path_scoped = True
        fleet = self.guards.fleet
        if fleet is not None and attempt.requested_s is not None:
            path = self.path if attempt.path_scoped else None
            await fleet.publish_cooldown(attempt.requested_s, path)

    def _learn_tool_hints(self, attempt: _Attempt) -> None:
        """Remember which tools a relayed ``tools/list`` result marks safe to repeat."""
        answer = attempt.result
        if isinstance(answer, Answer) and answer.decisive:
            response = answer.response
            self.guards.mcp_tools.learn(
                json_document(
                    response.content_type,
                    response.headers.get("Content-Encoding"),
                    answer.body,
                )
            )

    async def _next_step(self, attempt: _Attempt) -> Result | Wait | None:
        """What follows an attempt: a result to return, a wait, or (``None``) a repaired
        payload to send at once."""
        verdict = attempt.verdict
        if verdict.action is Action.DONE:
            if verdict.success:
                return self._stop(Outcome.OK if self.attempts == 1 else Outcome.RECOVERED, attempt)
            if verdict.reason == "overloaded":
                return self._stop(Outcome.OVERLOADED, attempt)
            slow = isinstance(attempt.result, Answer) and attempt.result.slow
            return self._stop(Outcome.NOT_RETRYABLE, attempt, "stop=slow_body" if slow else None)
        if attempt.result is AttemptError.TIMEOUT and attempt.cut_by_deadline:
            return self._stop(Outcome.DEADLINE, attempt, "stop=deadline")
        if self.payload is None or (verdict.only_if_safe and not self.replay_safe):
            # Sending it again could run the tool's work twice; the agent decides.
            return self._stop(Outcome.NOT_RETRYABLE, attempt, "stop=not_replayable")
        if verdict.action is Action.REPAIR:
            proposal = await self._repair(attempt)
            if proposal.payload is not None and proposal.layer is not None:
                return self._send_repaired(attempt, proposal.payload, proposal.layer)
            if not proposal.retry_same:
                return self._stop(Outcome.NOT_RETRYABLE, attempt, "repair=none")
        return self._wait_for_same(attempt)

    async def _repair(self, attempt: _Attempt) -> Proposal:
        assert attempt.reply is not None and self.payload is not None
        self.hooks.repair_started(self.route.name)
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
        self.hooks.repair_finished(self.route.name, proposal.layer)
        self.llm_repairs_left -= proposal.llm_repairs
        return proposal

    def _send_repaired(self, attempt: _Attempt, payload: Payload, layer: str) -> Result | None:
        """Send a repaired payload next, at once, if the limits allow another attempt."""
        if self.retries >= self.limits.max_retries:
            stopped = Outcome.EXHAUSTED
        elif self.deadline - self.clock() <= 0:
            stopped = Outcome.DEADLINE
        elif not self.guards.budget.try_spend():
            self.hooks.budget_exhausted(self.route.name)
            stopped = Outcome.BUDGET
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
            requested_s=attempt.requested_s,
            backoff=self.guards.backoff,
            previous_s=self.previous_wait,
            time_left_s=self.deadline - self.clock(),
            unreachable=attempt.result in _NOT_CONNECTED,
        )
        if isinstance(plan, Wait) and not self.guards.budget.try_spend():
            self.hooks.budget_exhausted(self.route.name)
            plan = Outcome.BUDGET
        if isinstance(plan, Outcome):
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

    def _stop(self, outcome: Outcome, attempt: _Attempt, note: str | None = None) -> Result:
        self.trail.append(f"{attempt.label} {note}" if note else attempt.label)
        return self._result(outcome, attempt)

    def _result(
        self, outcome: Outcome, last: _Attempt, paused_for_s: float | None = None
    ) -> Result:
        """The request's result; ``paused_for_s`` is how long the tool is not to be called,
        said as ``CIRCUIT_OPEN`` only when there is no answer of the tool's to give (the
        last one streamed on and is gone)."""
        error = last.result if isinstance(last.result, AttemptError) else None
        layers = self.answered_payload.layers if self.answered_payload is not None else ()
        result = Result(
            outcome,
            self.attempts,
            self.trail,
            self.last_answer,
            error,
            last.error_reason,
            repaired=layers,
        )
        if paused_for_s is not None and self.last_answer is None and error is None:
            result.circuit_open_for_s = paused_for_s
        return result


_NOT_CONNECTED = (AttemptError.CONNECT, AttemptError.CONNECT_TIMEOUT)


def _stopped_by(attempt: _Attempt) -> Outcome:
    """The outcome when retries end before their limit because of the tool's state."""
    return Outcome.UNREACHABLE if attempt.result in _NOT_CONNECTED else Outcome.EXHAUSTED


def _sending(request: UpstreamRequest, payload: Payload, key_header: str) -> UpstreamRequest:
    """``request`` carrying ``payload``, under a fresh idempotency key when it is the sidecar's,
    and with the agent's ``Content-Length`` restated when the payload's length differs.

    The sidecar's key names one payload: every retry of it carries the same key, and a
    repaired payload (a different request to the tool) gets a new one. A key the agent
    chose is the agent's to keep.
    """
    headers = request.headers
    length = str(len(payload.body))
    restate_length = "Content-Length" in headers and headers["Content-Length"] != length
    if key_header or restate_length:
        headers = headers.copy()
    if key_header:
        headers[key_header] = idempotency_key()
    if restate_length:
        headers["Content-Length"] = length
    return replace(request, headers=headers, body=payload.body)


def _seconds(value: float) -> str:
    """Short seconds for the trail, three significant digits: ``0.8s``, ``2s``, ``0.0163s``."""
    return f"{value:.3g}s"
