"""The Prometheus metrics of the contract: their names, help, labels and buckets, and the
bounded label values they take.

Which event moves which metric is the metrics sink's business (``telemetry.metrics``).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from sidecar import __version__
from sidecar.build import is_compiled

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


class Metrics:
    """The contract's metrics, registered on the registry given (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # ``*_created`` series double every counter's size and no dashboard reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream
        self.registry = registry
        # process_* (memory, open fds, CPU) and python_info, as every Python exporter has.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self.build_info = Gauge(
            "sidecar_build_info",
            "Build of the running sidecar",
            ["version", "compiled"],
            registry=registry,
        )
        compiled = "true" if is_compiled() else "false"
        self.build_info.labels(version=__version__, compiled=compiled).set(1)
        # The order of definition is the order of the exposition.
        self._define_request_metrics(registry)
        self._define_recovery_metrics(registry)
        self._define_llm_metrics(registry)
        self._define_guard_metrics(registry)

    def _define_request_metrics(self, registry: CollectorRegistry) -> None:
        """The agent's requests and the attempts sent upstream for them."""
        self.requests = Counter(
            "sidecar_requests_total",
            "Requests answered, by how they ended",
            ["route", "method", "outcome"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "sidecar_request_duration_seconds",
            "Time from request to answer headers, waits and retries included",
            ["route", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_attempts = Counter(
            "sidecar_upstream_attempts_total",
            "Attempts sent upstream, by status code, 'error' or 'cancelled' (lost a hedge race)",
            ["route", "status"],
            registry=registry,
        )
        self.upstream_duration = Histogram(
            "sidecar_upstream_duration_seconds",
            "Time of one upstream attempt until its answer was ready to decide on",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "sidecar_in_flight_requests",
            "Requests being handled now",
            ["route"],
            registry=registry,
        )
        self.buffered_bytes = Gauge(
            "sidecar_buffered_bytes",
            "Bytes of heads, bodies and answers held in memory (SIDECAR_MAX_BUFFERED_BYTES)",
            registry=registry,
        )
        self.loop_lag = Gauge(
            "sidecar_event_loop_lag_seconds",
            "How late the event loop last ran a timer: time a callback held it",
            registry=registry,
        )

    def _define_recovery_metrics(self, registry: CollectorRegistry) -> None:
        """Retries, their waits and budget, and payload repairs."""
        self.retries = Counter(
            "sidecar_retries_total",
            "Retries sent, by what prompted them",
            ["route", "reason"],
            registry=registry,
        )
        self.retry_wait = Histogram(
            "sidecar_retry_wait_seconds",
            "Waits before retries, by who chose their length",
            ["route", "source"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
            registry=registry,
        )
        self.budget_exhausted = Counter(
            "sidecar_retry_budget_exhausted_total",
            "Retries refused because the route's retry budget was spent",
            ["route"],
            registry=registry,
        )
        self.repairs = Counter(
            "sidecar_repairs_total",
            "Payload repairs, by layer and result",
            ["route", "layer", "result"],
            registry=registry,
        )

    def _define_llm_metrics(self, registry: CollectorRegistry) -> None:
        """The calls to the repair LLM."""
        self.llm_requests = Counter(
            "sidecar_llm_requests_total",
            "Calls to the repair LLM, by result",
            ["result"],
            registry=registry,
        )
        self.llm_response_format = Counter(
            "sidecar_llm_response_format_total",
            "Calls to the repair LLM, by the form their answer was held to",
            ["format"],
            registry=registry,
        )
        self.llm_duration = Histogram(
            "sidecar_llm_duration_seconds",
            "Time of one call to the repair LLM",
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30),
            registry=registry,
        )
        self.llm_tokens = Counter(
            "sidecar_llm_tokens_total",
            "Tokens the repair LLM reported using",
            ["kind"],
            registry=registry,
        )

    def _define_guard_metrics(self, registry: CollectorRegistry) -> None:
        """The fleet state store and the circuit breakers."""
        self.state_errors = Counter(
            "sidecar_state_errors_total",
            "Fleet state store calls that failed or timed out; local state was used instead",
            ["op"],
            registry=registry,
        )
        self.circuit_state = Gauge(
            "sidecar_circuit_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open",
            ["route", "tool"],
            registry=registry,
        )
        self.hedges = Counter(
            "sidecar_hedges_total",
            "Hedged attempts, by which copy answered first: won (the hedge), lost, unanswered",
            ["route", "result"],
            registry=registry,
        )
