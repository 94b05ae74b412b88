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
from sidecar.repair.pipeline import RepairJob, Repairs
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

    def __post_init__(self) -> None:
        result = self.result
        self.label = result.value if isinstance(result, AttemptError) else str(result.status)


class Engine:
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
        self._session = session
        self._hooks = hooks
        self._repairs = repairs
        self._inspect_limit = inspect_limit
        self._sleep = sleep
        self._clock = clock
        self._guards = {
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
        guards = self._guards[route.name]
        tuning = route.tuning
        limits = Limits(controls.max_retries, tuning.max_retry_after_ms / 1000)
        deadline = self._clock() + controls.timeout_s
        guards.budget.record_request()
        path = request.url.path
        own_key = tuning.idempotency_header
        if own_key in request.headers:
            own_key = ""
        if payload is not None:
            payload = self._repairs.prepare(
                route.name, request.method, path, payload, controls.repair
            )
            request = _sending(request, payload, own_key)
            if payload.layers:
                self._hooks.repair_result(route.name, "coercion", "applied")
        elif own_key:
            request = replace(request, headers=request.headers.copy())
            request.headers[own_key] = idempotency_key()
        sent_payloads = [payload] if payload is not None else []
        # The layer whose payload is being sent and whose first answer is not yet judged.
        unjudged_layer = payload.layers[-1] if payload is not None and payload.layers else None
        llm_repairs_left = tuning.llm_max_repairs
        trail: list[str] = []
        last_answer: Answer | None = None
        answered_payload: Payload | None = None
        retries = 0
        previous_wait: float | None = None
        attempt_number = 0

        def stop(reason: Stop | str, attempt: _Attempt, note: str | None = None) -> Result:
            outcome = reason.value if isinstance(reason, Stop) else reason
            trail.append(f"{attempt.label} {note}" if note else attempt.label)
            error = attempt.result if isinstance(attempt.result, AttemptError) else None
            layers = answered_payload.layers if answered_payload is not None else ()
            return Result(outcome, attempt_number, trail, last_answer, error, repaired=layers)

        while True:
            refused_for = guards.circuit.admit()
            self._hooks.circuit_state(route.name, guards.circuit.state)
            if refused_for is not None:
                trail.append("circuit_open")
                if last_answer is not None:
                    layers = answered_payload.layers if answered_payload else ()
                    return Result(
                        Stop.EXHAUSTED.value, attempt_number, trail, last_answer, repaired=layers
                    )
                return Result("unreachable", attempt_number, trail, circuit_open_for_s=refused_for)

            attempt_number += 1
            time_left = deadline - self._clock()
            per_try = min(tuning.per_try_timeout_ms / 1000, time_left)
            started = self._clock()
            try:
                result = await exchange(self._session, request, per_try, self._inspect_limit)
            except asyncio.CancelledError:
                guards.circuit.abandon()
                raise
            attempt = self._judge(result, tuning.retry_on_status)
            verdict = attempt.verdict
            guards.circuit.record(verdict.is_failure)
            self._hooks.circuit_state(route.name, guards.circuit.state)
            self._hooks.attempt_finished(
                route.name,
                attempt_number,
                attempt.label,
                self._clock() - started,
                attempt.reply.failure if attempt.reply else None,
            )
            if unjudged_layer is not None:
                result_name = "succeeded" if verdict.success else "failed"
                self._hooks.repair_result(route.name, unjudged_layer, result_name)
                unjudged_layer = None
            if isinstance(result, Answer):
                if last_answer is not None:
                    last_answer.discard()
                last_answer, answered_payload = result, payload

            if verdict.action is Action.DONE:
                if verdict.success:
                    return stop("ok" if attempt_number == 1 else "recovered", attempt)
                return stop(Stop.NOT_RETRYABLE, attempt)
            if result is AttemptError.TIMEOUT and per_try < tuning.per_try_timeout_ms / 1000:
                return stop(Stop.DEADLINE, attempt, "stop=deadline")
            if payload is None:
                return stop(Stop.NOT_RETRYABLE, attempt, "stop=not_replayable")

            if verdict.action is Action.REPAIR:
                assert attempt.reply is not None
                proposal = await self._repairs.propose(
                    RepairJob(
                        route=route.name,
                        method=request.method,
                        path=path,
                        payload=payload,
                        reply=attempt.reply,
                        attempt=attempt_number,
                        level=controls.repair,
                        intent=controls.intent,
                        tried={sent.fingerprint for sent in sent_payloads},
                        llm_allowed=llm_repairs_left > 0,
                        time_left_s=deadline - self._clock(),
                    )
                )
                llm_repairs_left -= proposal.asked_llm
                if proposal.payload is not None and proposal.layer is not None:
                    stopped = self._may_retry(guards, route.name, retries, limits, deadline)
                    if stopped is not None:
                        return stop(stopped, attempt, f"stop={stopped.value}")
                    self._hooks.repaired_retry(
                        route.name, attempt_number, attempt.label, proposal.layer
                    )
                    trail.append(f"{attempt.label} repair={proposal.layer}")
                    payload = proposal.payload
                    unjudged_layer = proposal.layer
                    sent_payloads.append(payload)
                    request = _sending(request, payload, own_key)
                    retries += 1
                    continue
                if not proposal.retry_same:
                    return stop(Stop.NOT_RETRYABLE, attempt, "repair=none")

            # The same payload again, after a wait.
            plan = plan_wait(
                retries_done=retries,
                limits=limits,
                requested_s=self._requested_wait(attempt),
                backoff=guards.backoff,
                previous_s=previous_wait,
                time_left_s=deadline - self._clock(),
                unreachable=result is AttemptError.CONNECT,
            )
            if isinstance(plan, Wait) and not guards.budget.try_spend():
                self._hooks.budget_exhausted(route.name)
                plan = Stop.BUDGET
            if isinstance(plan, Stop):
                return stop(plan, attempt, f"stop={plan.value}")

            if last_answer is not None and not last_answer.complete:
                # An answer still streaming holds a connection; it cannot wait for us.
                last_answer.discard()
                last_answer = None
            self._hooks.retry_scheduled(
                route.name,
                attempt_number,
                attempt.label,
                verdict.reason if verdict.action is Action.RETRY else "server_error",
                plan,
                attempt.reply.failure if attempt.reply else None,
            )
            trail.append(f"{attempt.label} {plan.source}={_seconds(plan.seconds)}")
            await self._sleep(plan.seconds)
            retries += 1
            previous_wait = plan.seconds

    def _may_retry(
        self, guards: RouteGuards, route: str, retries: int, limits: Limits, deadline: float
    ) -> Stop | None:
        """Why a repaired payload may not be sent now, if it may not."""
        if retries >= limits.max_retries:
            return Stop.EXHAUSTED
        if deadline - self._clock() <= 0:
            return Stop.DEADLINE
        if not guards.budget.try_spend():
            self._hooks.budget_exhausted(route)
            return Stop.BUDGET
        return None

    def _judge(self, result: Answer | AttemptError, retry_on_status: frozenset[int]) -> _Attempt:
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

    @staticmethod
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
