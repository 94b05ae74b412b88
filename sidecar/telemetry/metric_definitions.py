"""The Prometheus metrics of the contract: their names, help, labels and buckets, and the
bounded label values they take.

Which event moves which metric is the metrics sink's business (``telemetry.metrics``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sidecar import __version__
from sidecar.build import is_compiled
from sidecar.telemetry.metric_series import CounterSeries, GaugeSeries, HistogramSeries

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# Methods an agent can send are unbounded tokens; only these become label values.
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)

# The repair layer's refusals counted under their own ``result`` of ``sidecar_repairs_total``
# (every other refused proposal counts as ``failed``): a model's proposal that touched a
# field the tool did not name, a model's answer given up past its byte or token bound, and
# a payload too large to put in a prompt.
REFUSALS_COUNTED_APART = frozenset(
    {"out_of_scope", "answer_too_large", "answer_cut", "prompt_too_large"}
)


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else "OTHER"


class Metrics(Collector):
    """The contract's metrics, registered on the registry given (never the global one) as
    one collector that builds their families when scraped (``metric_series`` says why)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # process_* (memory, open fds, CPU) and python_info, as every Python exporter has.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self.build_info = GaugeSeries(
            "sidecar_build_info", "Build of the running sidecar", ("version", "compiled")
        )
        self.build_info.set((__version__, "true" if is_compiled() else "false"), 1)
        self._define_request_metrics()
        self._define_recovery_metrics()
        self._define_llm_metrics()
        self._define_guard_metrics()
        # The order of definition is the order of the exposition.
        self._series = (
            self.build_info,
            self.requests,
            self.request_duration,
            self.upstream_attempts,
            self.upstream_duration,
            self.in_flight,
            self.buffered_bytes,
            self.loop_lag,
            self.retries,
            self.retry_wait,
            self.budget_exhausted,
            self.sessions_reopened,
            self.repairs,
            self.llm_requests,
            self.llm_response_format,
            self.llm_duration,
            self.llm_tokens,
            self.state_errors,
            self.circuit_state,
            self.hedges,
        )
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        for series in self._series:
            yield series.family()

    def _define_request_metrics(self) -> None:
        """The agent's requests and the attempts sent upstream for them."""
        self.requests = CounterSeries(
            "sidecar_requests_total",
            "Requests answered, by how they ended",
            ("route", "method", "outcome"),
        )
        self.request_duration = HistogramSeries(
            "sidecar_request_duration_seconds",
            "Time from request to answer headers, waits and retries included",
            _LATENCY_BUCKETS,
            ("route", "outcome"),
        )
        self.upstream_attempts = CounterSeries(
            "sidecar_upstream_attempts_total",
            "Attempts sent upstream, by status code, 'error' or 'cancelled' (lost a hedge race)",
            ("route", "status"),
        )
        self.upstream_duration = HistogramSeries(
            "sidecar_upstream_duration_seconds",
            "Time of one upstream attempt until its answer was ready to decide on",
            _LATENCY_BUCKETS,
            ("route",),
        )
        self.in_flight = GaugeSeries(
            "sidecar_in_flight_requests", "Requests being handled now", ("route",)
        )
        self.buffered_bytes = GaugeSeries(
            "sidecar_buffered_bytes",
            "Bytes of heads, bodies and answers held in memory (SIDECAR_MAX_BUFFERED_BYTES)",
        )
        self.loop_lag = GaugeSeries(
            "sidecar_event_loop_lag_seconds",
            "How late the event loop last ran a timer: time a callback held it",
        )

    def _define_recovery_metrics(self) -> None:
        """Retries, their waits and budget, and payload repairs."""
        self.retries = CounterSeries(
            "sidecar_retries_total", "Retries sent, by what prompted them", ("route", "reason")
        )
        self.retry_wait = HistogramSeries(
            "sidecar_retry_wait_seconds",
            "Waits before retries, by who chose their length",
            (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
            ("route", "source"),
        )
        self.budget_exhausted = CounterSeries(
            "sidecar_retry_budget_exhausted_total",
            "Retries refused because the route's retry budget was spent",
            ("route",),
        )
        self.sessions_reopened = CounterSeries(
            "sidecar_mcp_sessions_reopened_total",
            "MCP sessions their server forgot, opened again (reopened) or not (failed)",
            ("route", "result"),
        )
        self.repairs = CounterSeries(
            "sidecar_repairs_total",
            "Payload repairs, by layer and result",
            ("route", "layer", "result"),
        )

    def _define_llm_metrics(self) -> None:
        """The calls to the repair LLM."""
        self.llm_requests = CounterSeries(
            "sidecar_llm_requests_total", "Calls to the repair LLM, by result", ("result",)
        )
        self.llm_response_format = CounterSeries(
            "sidecar_llm_response_format_total",
            "Calls to the repair LLM, by the form their answer was held to",
            ("format",),
        )
        self.llm_duration = HistogramSeries(
            "sidecar_llm_duration_seconds",
            "Time of one call to the repair LLM",
            (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30),
        )
        self.llm_tokens = CounterSeries(
            "sidecar_llm_tokens_total", "Tokens the repair LLM reported using", ("kind",)
        )

    def _define_guard_metrics(self) -> None:
        """The fleet state store and the circuit breakers."""
        self.state_errors = CounterSeries(
            "sidecar_state_errors_total",
            "Fleet state store calls that failed or timed out; local state was used instead",
            ("op",),
        )
        self.circuit_state = GaugeSeries(
            "sidecar_circuit_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open",
            ("route", "tool"),
        )
        self.hedges = CounterSeries(
            "sidecar_hedges_total",
            "Hedged attempts, by which copy answered first: won (the hedge), lost, unanswered",
            ("route", "result"),
        )
