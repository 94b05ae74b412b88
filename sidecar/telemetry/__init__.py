"""What each event of a request records, and where: the one place sinks are registered.

A new sink is a module with a ``Sink`` subclass (a method per event it records, named as
the event: see ``events.ALL_EVENTS``) and one line in ``build_hooks``; its methods are
checked when ``Hooks`` registers it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from sidecar.telemetry.contract import Hooks, Sink, Tracer
from sidecar.telemetry.logs import LogSink
from sidecar.telemetry.metric_definitions import Metrics
from sidecar.telemetry.metrics import MetricsSink
from sidecar.telemetry.otel import tracer_provider, tracing_exporters
from sidecar.telemetry.recent import RecentCalls

__all__ = ["Hooks", "Sink", "build_hooks"]


def build_hooks(
    metrics: Metrics,
    *,
    access_log: bool = False,
    clock: Callable[[], float] = time.monotonic,
    llm_model: str = "",
    environ: Mapping[str, str] = os.environ,
    recent: RecentCalls | None = None,
) -> Hooks:
    """The app's hooks: traces when ``OTEL_*`` asks for them (their open spans the hooks'
    ``Tracer``), then metrics, then logs, then ``recent`` (the live page's) when given."""
    sinks: list[Sink] = []
    tracer: Tracer | None = None
    exporters = tracing_exporters(environ)
    if exporters:
        from sidecar.telemetry.traces import OpenSpans, TraceSink

        tracer = OpenSpans()
        sinks.append(TraceSink(tracer_provider(exporters), llm_model=llm_model, spans=tracer))
    sinks.append(MetricsSink(metrics))
    sinks.append(LogSink(access_log=access_log, clock=clock))
    if recent is not None:
        sinks.append(recent)
    return Hooks(sinks, tracer)
