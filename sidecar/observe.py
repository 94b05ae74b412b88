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
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from sidecar import __version__

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


class Hooks:
    """What each stage of a request records. One instance per app."""

    def __init__(self, metrics: Metrics, *, access_log: bool = False) -> None:
        self.metrics = metrics
        self.log = structlog.get_logger("sidecar")
        self._access_log = access_log

    def request_received(self, route: str, method: str) -> None:
        """A request was matched to ``route``: it is now in flight."""
        self.metrics.in_flight.labels(route=route).inc()
        self.log.debug("request_received", route=route, method=method)

    def attempt_finished(
        self, route: str, attempt: int, status: int | str, duration_s: float
    ) -> None:
        """One upstream attempt ended with a status code, or an error kind."""
        label = str(status) if isinstance(status, int) else "error"
        self.metrics.upstream_attempts.labels(route=route, status=label).inc()
        self.metrics.upstream_duration.labels(route=route).observe(duration_s)
        self.log.debug(
            "upstream_attempt",
            route=route,
            attempt=attempt,
            status=status if isinstance(status, int) else None,
            reason=None if isinstance(status, int) else status,
            duration_ms=round(duration_s * 1000, 1),
        )

    def request_finished(
        self,
        route: str,
        method: str,
        outcome: str,
        status: int,
        attempts: int,
        duration_s: float,
        *,
        matched: bool = True,
    ) -> None:
        """The answer's headers went to the agent (or the agent went away)."""
        if matched:
            self.metrics.in_flight.labels(route=route).dec()
        self.metrics.requests.labels(route=route, method=method, outcome=outcome).inc()
        self.metrics.request_duration.labels(route=route, outcome=outcome).observe(duration_s)
        emit = self.log.info if self._access_log else self.log.debug
        emit(
            "request_done",
            route=route,
            method=method,
            outcome=outcome,
            status=status,
            attempt=attempts,
            duration_ms=round(duration_s * 1000, 1),
        )
