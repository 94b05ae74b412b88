"""The contract's metrics, from the events that move them."""

from __future__ import annotations

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
    RequestFinished,
    RequestReceived,
    RetryScheduled,
    SessionReopened,
    StateError,
)
from sidecar.telemetry.metric_definitions import REFUSALS_COUNTED_APART, Metrics, method_label


class MetricsSink(Sink):
    """Counts and times each event on the app's ``Metrics``; the two duration histograms
    carry the event's ``exemplar`` (a sampled span's ids) when it has one."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def request_received(self, event: RequestReceived) -> None:
        self.metrics.in_flight.inc((event.route,))

    def attempt_finished(self, event: AttemptFinished) -> None:
        label = event.label
        status_label = label if label.isdigit() or label == CANCELLED_ATTEMPT else "error"
        self.metrics.upstream_attempts.inc((event.route, status_label))
        self.metrics.upstream_duration.observe((event.route,), event.duration_s, event.exemplar)

    def retry_scheduled(self, event: RetryScheduled) -> None:
        self.metrics.retries.inc((event.route, event.reason))
        self.metrics.retry_wait.observe((event.route, event.wait.source), event.wait.seconds)

    def repaired_retry(self, event: RepairedRetry) -> None:
        self.metrics.retries.inc((event.route, "repaired"))
        self.metrics.repairs.inc((event.route, event.layer, "applied"))

    def repair_result(self, event: RepairResult) -> None:
        self.metrics.repairs.inc((event.route, event.layer, event.result))

    def repair_refused(self, event: RepairRefused) -> None:
        # A proposal out of the tool's scope is counted as such: a model that obeys text it
        # was shown is something an operator watches for.
        result = event.reason if event.reason in REFUSALS_COUNTED_APART else "failed"
        self.metrics.repairs.inc((event.route, event.layer, result))

    def llm_reask(self, event: LlmReask) -> None:
        self.metrics.repairs.inc((event.route, "llm", "reasked"))

    def llm_call_finished(self, event: LlmCallFinished) -> None:
        self.metrics.llm_requests.inc((event.result,))
        self.metrics.llm_response_format.inc((event.response_format,))
        self.metrics.llm_duration.observe((), event.duration_s)
        if event.input_tokens:
            self.metrics.llm_tokens.inc(("prompt",), event.input_tokens)
        if event.output_tokens:
            self.metrics.llm_tokens.inc(("completion",), event.output_tokens)

    def budget_exhausted(self, event: BudgetExhausted) -> None:
        self.metrics.budget_exhausted.inc((event.route,))

    def session_reopened(self, event: SessionReopened) -> None:
        result = "reopened" if event.opened else "failed"
        self.metrics.sessions_reopened.inc((event.route, result))

    def state_error(self, event: StateError) -> None:
        self.metrics.state_errors.inc((event.op,))

    def circuit_state(self, event: CircuitStateReported) -> None:
        self.metrics.circuit_state.set((event.route, event.tool), event.state)

    def hedge_finished(self, event: HedgeFinished) -> None:
        self.metrics.hedges.inc((event.route, event.result))

    def request_finished(self, event: RequestFinished) -> None:
        if event.matched:
            self.metrics.in_flight.inc((event.route,), -1.0)
        method = method_label(event.method)
        self.metrics.requests.inc((event.route, method, event.outcome))
        self.metrics.request_duration.observe(
            (event.route, event.outcome), event.duration_s, event.exemplar
        )
