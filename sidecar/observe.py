"""Metrics, logs, and the hooks through which the request pipeline reports each stage.

The pipeline never touches a metric or a logger itself: it calls one ``Hooks`` method
per stage, and each method's docstring says what that stage records.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import orjson
import structlog
from aiohttp.http_exceptions import HttpProcessingError
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
from sidecar.credentials import MASK, is_secret_name, mask_credentials
from sidecar.envelopes import ToolFailure
from sidecar.policy import Wait

UNMATCHED_ROUTE = "(none)"

# An open circuit refuses every request at once: one line per route per interval, with
# the number refused, says as much as thousands of lines would.
CIRCUIT_REFUSALS_INTERVAL_S = 10.0
_CIRCUIT_CLOSED = 0

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The contract's metrics, registered on the registry given (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # ``*_created`` series double every counter's size and no dashboard reads them.
        disable_created_metrics()
        self.registry = registry
        # process_* (memory, open fds, CPU) and python_info, as every Python exporter has.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
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
        self.state_errors = Counter(
            "sidecar_state_errors_total",
            "Fleet state store calls that failed or timed out; local state was used instead",
            ["op"],
            registry=registry,
        )
        self.circuit_state = Gauge(
            "sidecar_circuit_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open",
            ["route"],
            registry=registry,
        )


class _ClientFaultFilter(logging.Filter):
    """aiohttp logs a malformed request as a server error with a traceback (an unknown
    method on a new connection only at debug). It is the client's fault and the client
    already got its 400, so it becomes one info line."""

    def filter(self, record: logging.LogRecord) -> bool:
        fault = record.exc_info[1] if record.exc_info else None
        if isinstance(fault, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "malformed_request", ()
            record.reason = fault.message.strip().splitlines()[0].rstrip(":")
            record.exc_info = record.exc_text = None
        return True


def http_server_logger() -> logging.Logger:
    """The logger the proxy's HTTP server reports through."""
    logger = logging.getLogger("sidecar.http")
    # Every record is made, debug ones too, so the filter sees each malformed request;
    # the handler's gate then applies the configured level.
    logger.setLevel(logging.DEBUG)
    if not any(isinstance(existing, _ClientFaultFilter) for existing in logger.filters):
        logger.addFilter(_ClientFaultFilter())
    return logger


class _LevelGate(logging.Filter):
    """The sidecar's own records from the configured level, everyone else's (httpx,
    httpcore, openai, aiohttp, asyncio …) from WARNING at least: their debug and info
    lines are free text, one per connection step, and print URLs as they were given.

    The root logger's level does the same, but a library may set its own logger's level
    (``OPENAI_LOG=debug`` does): this gate holds whatever they set.
    """

    def __init__(self, own_level: int) -> None:
        super().__init__()
        self._own_level = own_level
        self._foreign_level = max(own_level, logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == "sidecar" or record.name.startswith("sidecar.")
        return record.levelno >= (self._own_level if own else self._foreign_level)


def _mask_secrets(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor: credentials out of a line's message, fields and traceback.

    Values under secret-looking names are masked whole; every other text (and anything
    the renderer would turn into text) loses URL userinfo, credential query values and
    HTTP credentials.
    """
    return {name: _masked(name, value) for name, value in event.items()}


def _masked(name: str, value: Any) -> Any:
    if value is not None and is_secret_name(name):
        return MASK
    if isinstance(value, Mapping):
        return {key: _masked(str(key), item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_masked(name, item) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return mask_credentials(value if isinstance(value, str) else str(value))


def _orjson_dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Every line the process logs, its own and its libraries', through one chain.

    One JSON object per line on stdout (or coloured lines for people); credentials are
    masked in each; libraries speak from WARNING up whatever the level.
    """
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
    # Tracebacks become text first, so the masking reaches them too.
    last = [structlog.processors.format_exc_info, _mask_secrets, renderer]
    numeric_level = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[*shared, *last],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.addFilter(_LevelGate(numeric_level))
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *last],
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric_level, logging.WARNING))
    logging.getLogger("sidecar").setLevel(numeric_level)
    # Python's warnings (a coroutine never awaited, a deprecation) are lines too.
    logging.captureWarnings(True)


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


class _Throttle:
    """Counts occurrences and says when one should be logged: the first, then at most one
    per ``interval_s``, carrying how many happened since the last one logged."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = 0.0
        self._count = 0

    def count(self) -> int:
        """0 when this occurrence stays silent, else how many to report (itself included)."""
        self._count += 1
        now = self._clock()
        if now < self._next_at:
            return 0
        self._next_at = now + self._interval_s
        count, self._count = self._count, 0
        return count

    def flush(self) -> int:
        """How many happened since the last one logged, now to report; the next occurrence
        is logged at once."""
        count, self._count, self._next_at = self._count, 0, 0.0
        return count


# Saturation can repeat thousands of times a second; one line per this many seconds says it.
_OVERLOAD_LOG_INTERVAL_S = 10.0


class Hooks:
    """What each stage of a request records. One instance per app."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        access_log: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.log = structlog.get_logger("sidecar")
        self._access_log = access_log
        self._child = _Children()
        self._clock = clock
        self._refusals: dict[str, _Throttle] = {}
        self._overloads = _Throttle(_OVERLOAD_LOG_INTERVAL_S)
        self._state_errors = _Throttle(_OVERLOAD_LOG_INTERVAL_S, clock)

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
        failure: BaseException | None = None,
    ) -> None:
        """One call to the LLM ended: ``ok``, ``error``, ``timeout`` or ``invalid``.

        A call that failed is logged with ``failure``'s class and the HTTP status it carries.
        """
        self._child(self.metrics.llm_requests, result).inc()
        self.metrics.llm_duration.observe(duration_s)
        if prompt_tokens:
            self._child(self.metrics.llm_tokens, "prompt").inc(prompt_tokens)
        if completion_tokens:
            self._child(self.metrics.llm_tokens, "completion").inc(completion_tokens)
        if result != "ok":
            self.log.warning("llm_request_failed", result=result, **_llm_failure_fields(failure))

    def schema_unavailable(self, route: str, reason: str) -> None:
        """A route's schema could not be loaded; the route runs without (or with the last)."""
        self.log.warning("schema_unavailable", route=route, reason=reason)

    def budget_exhausted(self, route: str) -> None:
        """A retry was refused: the route's retry budget is spent."""
        self._child(self.metrics.budget_exhausted, route).inc()

    def sidecar_overloaded(self, route: str | None, reason: str) -> None:
        """The sidecar itself had no room for a call: ``max_in_flight``, ``pool_timeout``
        (no free upstream connection) or ``fd_exhausted``. Logged once per interval."""
        count = self._overloads.count()
        if count:
            self.log.error("sidecar_overloaded", route=route, reason=reason, count=count)

    def state_error(self, op: str, error: BaseException) -> None:
        """A call to the fleet state store failed; the request went on with local state.
        Logged once per interval with the number since the last line."""
        self._child(self.metrics.state_errors, op).inc()
        count = self._state_errors.count()
        if count:
            self.log.warning(
                "state_store_unavailable", op=op, error=type(error).__name__, count=count
            )

    def circuit_state(self, route: str, state: int) -> None:
        """The route's circuit breaker is in ``state`` (0 closed, 1 half-open, 2 open).

        Once it closes, the refusals not yet logged are (half-open, it still refuses).
        """
        self._child(self.metrics.circuit_state, route).set(state)
        refusals = self._refusals.get(route)
        if state == _CIRCUIT_CLOSED and refusals is not None:
            self._log_refusals(route, refusals.flush())

    def circuit_refused(self, route: str) -> None:
        """The route's open circuit refused a request without trying the tool.

        Logged as one ``circuit_refusals`` line with the number refused since the route's
        previous line: at once for the first, then at most every
        ``CIRCUIT_REFUSALS_INTERVAL_S``. Each request is still counted in
        ``sidecar_requests_total``.
        """
        refusals = self._refusals.get(route)
        if refusals is None:
            refusals = self._refusals[route] = _Throttle(CIRCUIT_REFUSALS_INTERVAL_S, self._clock)
        self._log_refusals(route, refusals.count())

    def _log_refusals(self, route: str, count: int) -> None:
        if count:
            self.log.warning("circuit_refusals", route=route, count=count)

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
        # A request that was never tried (a refusal) did not try to recover either.
        tried_to_recover = attempts > 1 or trail.endswith("repair=none")
        if outcome == "recovered":
            self.log.info("recovery_succeeded", trail=trail, **fields)
        elif attempts and (outcome in GAVE_UP or (outcome == "not-retryable" and tried_to_recover)):
            self.log.info("recovery_failed", trail=trail, **fields)
        emit = self.log.info if self._access_log else self.log.debug
        emit("request_done", **fields)


def _status_of(label: str) -> int | None:
    """An attempt label is a status code, or an error kind such as ``connect_error``."""
    return int(label) if label.isdigit() else None


def _llm_failure_fields(failure: BaseException | None) -> dict[str, Any]:
    """The error's class and HTTP status. A foreign message is left out: the model's server
    writes it and may echo the prompt or its own URL; the sidecar's own refusals name
    the guardrail their answer broke."""
    if failure is None:
        return {}
    fields: dict[str, Any] = {"error": type(failure).__name__}
    status = getattr(failure, "status_code", None)
    if isinstance(status, int):
        fields["status"] = status
    if type(failure).__module__.startswith("sidecar."):
        fields["reason"] = str(failure)
    return fields


def _failure_fields(failure: ToolFailure | None) -> dict[str, Any]:
    if failure is None:
        return {}
    fields = {"error_code": failure.code, "category": failure.category}
    return {name: value for name, value in fields.items() if value}
