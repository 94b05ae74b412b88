"""What the telemetry hooks cost for one request, in-process, with the real sinks.

The calls an ordinary request makes (received, circuit state, attempt started and
finished, circuit state, finished) and those of a request recovered after one 503, timed
with the default sinks (metrics, logs at info into /dev/null, the live page's), or with
``--traced`` the trace sink too (spans made and sampled, exported nowhere); ``--no-ui``
leaves out the live page's sink, as ``SIDECAR_UI=off`` does. With it, what that sink alone
takes of each request's last event is timed too.

    python bench/hooks.py [--traced] [--no-ui]
"""

from __future__ import annotations

import argparse
import functools
import os
import timeit
from collections.abc import Callable

from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from sidecar.outcomes import Wait
from sidecar.telemetry import Hooks, build_hooks
from sidecar.telemetry.events import Request, RequestFinished
from sidecar.telemetry.logging_setup import configure_logging
from sidecar.telemetry.metric_definitions import Metrics
from sidecar.telemetry.recent import RecentCalls

INCOMING = CIMultiDict({"content-type": "application/json"})
WAIT = Wait(0.1, "backoff")


def hooks_for(traced: bool, ui: bool) -> Hooks:
    metrics = Metrics(CollectorRegistry())
    recent = RecentCalls() if ui else None
    if not traced:
        return build_hooks(metrics, environ={}, recent=recent)
    from opentelemetry.sdk.trace import TracerProvider

    from sidecar.telemetry.logs import LogSink
    from sidecar.telemetry.metrics import MetricsSink
    from sidecar.telemetry.otel import Tracing
    from sidecar.telemetry.traces import OpenSpans, TraceSink

    # As build_hooks registers them: the trace sink's open spans are the hooks' tracer.
    spans = OpenSpans()
    traces = TraceSink(Tracing(TracerProvider(), [], None), llm_model="bench", spans=spans)
    sinks = [traces, MetricsSink(metrics), LogSink()]
    return Hooks([*sinks, recent] if recent is not None else sinks, spans)


def ordinary(hooks: Hooks) -> None:
    hooks.request_received("weather", "POST", INCOMING)
    hooks.circuit_state("weather", 0)
    hooks.attempt_started(1)
    hooks.attempt_finished("weather", 1, "200", 0.01, None)
    hooks.circuit_state("weather", 0)
    hooks.request_finished("weather", "POST", "ok", 200, 1, 0.02)


def recovered(hooks: Hooks) -> None:
    hooks.request_received("weather", "POST", INCOMING)
    hooks.circuit_state("weather", 0)
    hooks.attempt_started(1)
    hooks.attempt_finished("weather", 1, "503", 0.01, None)
    hooks.retry_scheduled("weather", 1, "503", "server_error", WAIT, None)
    hooks.attempt_started(2)
    hooks.attempt_finished("weather", 2, "200", 0.01, None)
    hooks.circuit_state("weather", 0)
    hooks.request_finished("weather", "POST", "recovered", 200, 2, 0.12, trail="503, 200")


def finished(outcome: str, attempts: int) -> RequestFinished:
    trail = "503 backoff=0.1s, 200" if attempts > 1 else ""
    request = Request("weather", "POST")
    return RequestFinished(
        "weather", "POST", "/x", outcome, 200, attempts, 0.12, trail, True, request
    )


# What the live page's sink is handed at the end of each sequence.
LAST_EVENTS = {"ordinary": finished("ok", 1), "recovered": finished("recovered", 2)}


def best_of(timed: Callable[[], object], runs: int) -> float:
    return min(timeit.repeat(timed, number=runs, repeat=7)) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traced", action="store_true")
    parser.add_argument("--no-ui", action="store_true", help="without the live page's sink")
    args = parser.parse_args()
    with open(os.devnull, "w") as devnull:
        configure_logging("info", "json", stream=devnull)
        hooks = hooks_for(args.traced, not args.no_ui)
        runs = 20_000 if args.traced else 50_000
        sequences: tuple[Callable[[Hooks], None], ...] = (ordinary, recovered)
        for sequence in sequences:
            sequence(hooks)
            best = best_of(functools.partial(sequence, hooks), runs)
            line = f"{'traced ' if args.traced else ''}{sequence.__name__}: {best * 1e6:.2f} µs"
            if not args.no_ui:
                sink = functools.partial(
                    RecentCalls().request_finished, LAST_EVENTS[sequence.__name__]
                )
                line += f" (the live page's sink: {best_of(sink, runs) * 1e6:.2f} µs)"
            print(line)


if __name__ == "__main__":
    main()
