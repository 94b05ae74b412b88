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
from dataclasses import dataclass, field

import aiohttp

from sidecar.budget import RetryBudget
from sidecar.circuit import CircuitBreaker
from sidecar.classify import Action, Reply, Verdict, classify
from sidecar.controls import RequestControls
from sidecar.envelopes import inspect
from sidecar.errors import AttemptError
from sidecar.observe import Hooks
from sidecar.policy import Backoff, Limits, Stop, Wait, plan_wait
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
        *,
        inspect_limit: int,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self._session = session
        self._hooks = hooks
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
        *,
        replayable: bool,
    ) -> Result:
        guards = self._guards[route.name]
        tuning = route.tuning
        limits = Limits(controls.max_retries, tuning.max_retry_after_ms / 1000)
        deadline = self._clock() + controls.timeout_s
        guards.budget.record_request()
        trail: list[str] = []
        last_answer: Answer | None = None
        retries = 0
        previous_wait: float | None = None
        attempt_number = 0

        def stop(reason: Stop | str, attempt: _Attempt, note: str | None = None) -> Result:
            outcome = reason.value if isinstance(reason, Stop) else reason
            trail.append(f"{attempt.label} {note}" if note else attempt.label)
            error = attempt.result if isinstance(attempt.result, AttemptError) else None
            return Result(outcome, attempt_number, trail, last_answer, error)

        while True:
            refused_for = guards.circuit.admit()
            self._hooks.circuit_state(route.name, guards.circuit.state)
            if refused_for is not None:
                trail.append("circuit_open")
                if last_answer is not None:
                    return Result(Stop.EXHAUSTED.value, attempt_number, trail, last_answer)
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
            guards.circuit.record(attempt.verdict.is_failure)
            self._hooks.circuit_state(route.name, guards.circuit.state)
            self._hooks.attempt_finished(
                route.name,
                attempt_number,
                attempt.label,
                self._clock() - started,
                attempt.reply.failure if attempt.reply else None,
            )
            if isinstance(result, Answer):
                if last_answer is not None:
                    last_answer.discard()
                last_answer = result

            verdict = attempt.verdict
            if verdict.action is Action.DONE:
                if verdict.success:
                    return stop("ok" if attempt_number == 1 else "recovered", attempt)
                return stop(Stop.NOT_RETRYABLE, attempt)
            if verdict.action is Action.REPAIR:
                return stop(Stop.NOT_RETRYABLE, attempt, "repair=none")
            if result is AttemptError.TIMEOUT and per_try < tuning.per_try_timeout_ms / 1000:
                return stop(Stop.DEADLINE, attempt, "stop=deadline")
            if not replayable:
                return stop(Stop.NOT_RETRYABLE, attempt, "stop=not_replayable")

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
                verdict.reason,
                plan,
                attempt.reply.failure if attempt.reply else None,
            )
            trail.append(f"{attempt.label} {plan.source}={_seconds(plan.seconds)}")
            await self._sleep(plan.seconds)
            retries += 1
            previous_wait = plan.seconds

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


def _seconds(value: float) -> str:
    """Short seconds for the trail: ``0.8s``, ``2s``, ``0.05s``."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text}s"
