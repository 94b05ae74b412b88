"""The contract's metrics, from the stages that move them."""

from __future__ import annotations

from typing import Any

from sidecar.telemetry.contract import RequestState, Sink
from sidecar.telemetry.metric_definitions import Metrics, method_label


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
    """Counts and times each stage on the app's ``Metrics``; the two duration histograms
    carry ``state.exemplar`` (a sampled span's ids) when a sink before this one set it."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._child = _Children()

    def request_received(self, state: RequestState) -> None:
        self._child(self.metrics.in_flight, state.route).inc()

    def attempt_finished(self, state: RequestState) -> None:
        status_label = state.label if state.label.isdigit() else "error"
        self._child(self.metrics.upstream_attempts, state.route, status_label).inc()
        self._child(self.metrics.upstream_duration, state.route).observe(
            state.attempt_s, state.exemplar
        )

    def retry_scheduled(self, state: RequestState) -> None:
        assert state.wait is not None
        self._child(self.metrics.retries, state.route, state.reason).inc()
        self._child(self.metrics.retry_wait, state.route, state.wait.source).observe(
            state.wait.seconds
        )

    def repaired_retry(self, state: RequestState) -> None:
        self._child(self.metrics.retries, state.route, "repaired").inc()
        self._child(self.metrics.repairs, state.route, state.layer, "applied").inc()

    def repair_result(self, state: RequestState) -> None:
        self._child(self.metrics.repairs, state.route, state.layer, state.result).inc()

    def repair_refused(self, state: RequestState) -> None:
        self._child(self.metrics.repairs, state.route, state.layer, "failed").inc()

    def llm_reask(self, state: RequestState) -> None:
        self._child(self.metrics.repairs, state.route, "llm", "reasked").inc()

    def llm_request(self, state: RequestState) -> None:
        call = state.llm
        assert call is not None
        self._child(self.metrics.llm_requests, call.result).inc()
        self.metrics.llm_duration.observe(call.duration_s)
        if call.input_tokens:
            self._child(self.metrics.llm_tokens, "prompt").inc(call.input_tokens)
        if call.output_tokens:
            self._child(self.metrics.llm_tokens, "completion").inc(call.output_tokens)

    def budget_exhausted(self, state: RequestState) -> None:
        self._child(self.metrics.budget_exhausted, state.route).inc()

    def state_error(self, state: RequestState) -> None:
        self._child(self.metrics.state_errors, state.reason).inc()

    def circuit_state(self, state: RequestState) -> None:
        self._child(self.metrics.circuit_state, state.route).set(state.circuit)

    def request_finished(self, state: RequestState) -> None:
        if state.matched:
            self._child(self.metrics.in_flight, state.route).dec()
        method = method_label(state.method)
        self._child(self.metrics.requests, state.route, method, state.outcome).inc()
        self._child(self.metrics.request_duration, state.route, state.outcome).observe(
            state.duration_s, state.exemplar
        )
