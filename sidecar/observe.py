"""Metrics, logs, and the hooks through which the request pipeline reports each stage.

The pipeline never touches a metric or a logger itself: it calls one ``Hooks`` method
per stage, and each method's docstring says what that stage records.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import orjson
import structlog
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from sidecar import __version__
from sidecar.envelopes import ToolFailure
from sidecar.policy import Wait

UNMATCHED_ROUTE = "(none)"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The contract's metrics, registered on the registry given (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # ``*_created`` series double every counter's size and no dashboard reads them.
        disable_created_metrics()
        self.registry = registry
        self.build_info = Gauge(
            "sidecar_build_info", "Build of the running sidecar", ["version"], registry=registry
        )
        self.build_info.labels(version=__version__).set(1)
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
            "Attempts sent upstream, by status code or 'error'",
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
        self.llm_requests = Counter(
            "sidecar_llm_requests_total",
            "Calls to the repair LLM, by result",
            ["result"],
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
        self.circuit_state = Gauge(
            "sidecar_circuit_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open",
            ["route"],
            registry=registry,
        )


class _ClientFaultFilter(logging.Filter):
    """aiohttp logs a malformed request as a server error with a traceback. It is the
    client's fault and the client already got its 400, so it becomes one info line."""

    def filter(self, record: logging.LogRecord) -> bool:
        fault = record.exc_info[1] if record.exc_info else None
        if isinstance(fault, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "malformed_request", ()
            record.reason = fault.message.strip().splitlines()[0]
            record.exc_info = record.exc_text = None
        return True


def http_server_logger() -> logging.Logger:
    """The logger the proxy's HTTP server reports through."""
    logger = logging.getLogger("sidecar.http")
    if not any(isinstance(existing, _ClientFaultFilter) for existing in logger.filters):
        logger.addFilter(_ClientFaultFilter())
    return logger


def _orjson_dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """One JSON object per line on stdout (or coloured lines for people), aiohttp's too."""
    stream = stream or sys.stdout
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    numeric_level = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)


# Outcomes in which the sidecar stopped trying while the tool was still failing.
GAVE_UP = frozenset({"exhausted", "unreachable", "budget-exhausted", "deadline"})


# Methods an agent can send are unbounded tokens; only these become label values.
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else "OTHER"


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


class Hooks:
    """What each stage of a request records. One instance per app."""

    def __init__(self, metrics: Metrics, *, access_log: bool = False) -> None:
        self.metrics = metrics
        self.log = structlog.get_logger("sidecar")
        self._access_log = access_log
        self._child = _Children()

    def request_received(self, route: str, method: str) -> None:
        """A request was matched to ``route``: it is now in flight."""
        self._child(self.metrics.in_flight, route).inc()
        self.log.debug("request_received", route=route, method=method)

    def attempt_finished(
        self,
        route: str,
        attempt: int,
        label: str,
        duration_s: float,
        failure: ToolFailure | None,
    ) -> None:
        """One upstream attempt ended; ``label`` is its status code or its error kind."""
        status = _status_of(label)
        status_label = label if status else "error"
        self._child(self.metrics.upstream_attempts, route, status_label).inc()
        self._child(self.metrics.upstream_duration, route).observe(duration_s)
        outcome = {"status": status} if status else {"reason": label}
        self.log.debug(
            "upstream_attempt",
            route=route,
            attempt=attempt,
            duration_ms=round(duration_s * 1000, 1),
            **outcome,
            **_failure_fields(failure),
        )

    def retry_scheduled(
        self,
        route: str,
        attempt: int,
        label: str,
        reason: str,
        wait: Wait,
        failure: ToolFailure | None,
    ) -> None:
        """A retry will follow attempt ``attempt`` after ``wait``."""
        self._child(self.metrics.retries, route, reason).inc()
        self._child(self.metrics.retry_wait, route, wait.source).observe(wait.seconds)
        self.log.info(
            "retry_scheduled",
            route=route,
            attempt=attempt,
            status=_status_of(label),
            reason=reason,
            delay_ms=round(wait.seconds * 1000),
            wait_source=wait.source,
            **_failure_fields(failure),
        )

    def repaired_retry(self, route: str, attempt: int, label: str, layer: str) -> None:
        """A repaired payload will be sent right away after attempt ``attempt``."""
        self._child(self.metrics.retries, route, "repaired").inc()
        self._child(self.metrics.repairs, route, layer, "applied").inc()
        self.log.info(
            "retry_scheduled",
            route=route,
            attempt=attempt,
            status=_status_of(label),
            reason="repaired",
            layer=layer,
            delay_ms=0,
        )

    def payload_repaired(self, route: str, layer: str, fields: list[str]) -> None:
        """A layer changed these fields of the payload (their values are never logged)."""
        self.log.info("payload_repaired", route=route, layer=layer, fields=fields[:50])

    def repair_result(self, route: str, layer: str, result: str) -> None:
        """A layer's work ended: ``succeeded``/``failed`` (its payload's answer), ``declined``."""
        self._child(self.metrics.repairs, route, layer, result).inc()

    def repair_refused(self, route: str, layer: str, why: str) -> None:
        """A layer's proposal broke a guardrail and was not sent."""
        self._child(self.metrics.repairs, route, layer, "failed").inc()
        self.log.info("repair_refused", route=route, layer=layer, reason=why)

    def llm_request(
        self,
        result: str,
        duration_s: float,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """One call to the LLM ended: ``ok``, ``error``, ``timeout`` or ``invalid``."""
        self._child(self.metrics.llm_requests, result).inc()
        self.metrics.llm_duration.observe(duration_s)
        if prompt_tokens:
            self._child(self.metrics.llm_tokens, "prompt").inc(prompt_tokens)
        if completion_tokens:
            self._child(self.metrics.llm_tokens, "completion").inc(completion_tokens)
        if result != "ok":
            self.log.warning("llm_request_failed", result=result)

    def llm_reask(self, route: str, reason: str) -> None:
        """The model's answer was refused for ``reason``; it is asked again, told why."""
        self._child(self.metrics.repairs, route, "llm", "reasked").inc()
        self.log.info("llm_reask", route=route, reason=reason)

    def schema_unavailable(self, route: str, reason: str) -> None:
        """A route's schema could not be loaded; the route runs without (or with the last)."""
        self.log.warning("schema_unavailable", route=route, reason=reason)

    def budget_exhausted(self, route: str) -> None:
        """A retry was refused: the route's retry budget is spent."""
        self._child(self.metrics.budget_exhausted, route).inc()

    def circuit_state(self, route: str, state: int) -> None:
        """The route's circuit breaker is in ``state`` (0 closed, 1 half-open, 2 open)."""
        self._child(self.metrics.circuit_state, route).set(state)

    def request_finished(
        self,
        route: str,
        method: str,
        outcome: str,
        status: int,
        attempts: int,
        duration_s: float,
        *,
        trail: str = "",
        matched: bool = True,
    ) -> None:
        """The answer's headers went to the agent (or the agent went away)."""
        if matched:
            self._child(self.metrics.in_flight, route).dec()
        self._child(self.metrics.requests, route, method_label(method), outcome).inc()
        self._child(self.metrics.request_duration, route, outcome).observe(duration_s)
        fields = {
            "route": route,
            "method": method,
            "outcome": outcome,
            "status": status,
            "attempt": attempts,
            "duration_ms": round(duration_s * 1000, 1),
        }
        if outcome == "recovered":
            self.log.info("recovery_succeeded", trail=trail, **fields)
        elif outcome in GAVE_UP or (outcome == "not-retryable" and attempts > 1):
            self.log.info("recovery_failed", trail=trail, **fields)
        emit = self.log.info if self._access_log else self.log.debug
        emit("request_done", **fields)


def _status_of(label: str) -> int | None:
    """An attempt label is a status code, or an error kind such as ``connect_error``."""
    return int(label) if label.isdigit() else None


def _failure_fields(failure: ToolFailure | None) -> dict[str, Any]:
    if failure is None:
        return {}
    fields = {"error_code": failure.code, "category": failure.category}
    return {name: value for name, value in fields.items() if value}
