"""The contract's metrics, from the events that move them."""

from __future__ import annotations

from typing import Any

from sidecar.outcomes import CANCELLED_ATTEMPT
from sidecar.telemetry.contract import Sink
from sidecar.telemetry.events import (
    AttemptFinished,
    BudgetExhausted,
    CircuitStateReported,
    HedgeFinished,
    LlmCallFinished,
    LlmReask,
    RepairedRetry,
    RepairRefused,
    RepairResult,
    Request,
    RequestFinished,
    RequestReceived,
    RetryScheduled,
    StateError,
)
from sidecar.telemetry.metric_definitions import REFUSALS_COUNTED_APART, Metrics, method_label


class _Children:
    """Labelled metric children, built once: ``labels()`` takes a lock and checks its input
    on every call, which the hot path should not pay for the same few label sets."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*values)
        return child


class MetricsSink(Sink):
    """Counts and times each event on the app's ``Metrics``; the two duration histograms
    carry the request's ``exemplar`` (a sampled span's ids) when a sink before this one
    set it."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._child = _Children()

    def request_received(self, event: RequestReceived) -> None:
        self._child(self.metrics.in_flight, event.route).inc()

    def attempt_finished(self, event: AttemptFinished) -> None:
        label = event.label
        status_label = label if label.isdigit() or label == CANCELLED_ATTEMPT else "error"
        self._child(self.metrics.upstream_attempts, event.route, status_label).inc()
        self._child(self.metrics.upstream_duration, event.route).observe(
            event.duration_s, _exemplar(event.request)
        )

    def retry_scheduled(self, event: RetryScheduled) -> None:
        self._child(self.metrics.retries, event.route, event.reason).inc()
        self._child(self.metrics.retry_wait, event.route, event.wait.source).observe(
            event.wait.seconds
        )

    def repaired_retry(self, event: RepairedRetry) -> None:
        self._child(self.metrics.retries, event.route, "repaired").inc()
        self._child(self.metrics.repairs, event.route, event.layer, "applied").inc()

    def repair_result(self, event: RepairResult) -> None:
        self._child(self.metrics.repairs, event.route, event.layer, event.result).inc()

    def repair_refused(self, event: RepairRefused) -> None:
        # A proposal out of the tool's scope is counted as such: a model that obeys text it
        # was shown is something an operator watches for.
        result = event.reason if event.reason in REFUSALS_COUNTED_APART else "failed"
        self._child(self.metrics.repairs, event.route, event.layer, result).inc()

    def llm_reask(self, event: LlmReask) -> None:
        self._child(self.metrics.repairs, event.route, "llm", "reasked").inc()

    def llm_call_finished(self, event: LlmCallFinished) -> None:
        self._child(self.metrics.llm_requests, event.result).inc()
        self._child(self.metrics.llm_response_format, event.response_format).inc()
        self.metrics.llm_duration.observe(event.duration_s)
        if event.input_tokens:
            self._child(self.metrics.llm_tokens, "prompt").inc(event.input_tokens)
        if event.output_tokens:
            self._child(self.metrics.llm_tokens, "completion").inc(event.output_tokens)

    def budget_exhausted(self, event: BudgetExhausted) -> None:
        self._child(self.metrics.budget_exhausted, event.route).inc()

    def state_error(self, event: StateError) -> None:
        self._child(self.metrics.state_errors, event.op).inc()

    def circuit_state(self, event: CircuitStateReported) -> None:
        self._child(self.metrics.circuit_state, event.route, event.tool).set(event.state)

    def hedge_finished(self, event: HedgeFinished) -> None:
        self._child(self.metrics.hedges, event.route, event.result).inc()

    def request_finished(self, event: RequestFinished) -> None:
        if event.matched:
            self._child(self.metrics.in_flight, event.route).dec()
        method = method_label(event.method)
        self._child(self.metrics.requests, event.route, method, event.outcome).inc()
        self._child(self.metrics.request_duration, event.route, event.outcome).observe(
            event.duration_s, _exemplar(event.request)
        )


def _exemplar(request: Request | None) -> dict[str, str] | None:
    return request.exemplar if request is not None else None
