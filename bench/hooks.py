"""What the telemetry hooks cost for one request, in-process, with the real sinks.

The calls an ordinary request makes (received, circuit state, attempt started and
finished, circuit state, finished) and those of a request recovered after one 503, timed
with the default sinks (metrics, logs at info into /dev/null), or with ``--traced`` the
trace sink too (spans made and sampled, exported nowhere).

    python bench/hooks.py [--traced]
"""

from __future__ import annotations

import argparse
import functools
import os
import timeit
from collections.abc import Callable

from multidict import CIMultiDict
from prometheus_client import CollectorRegistry
from yarl import URL

from sidecar.outcomes import Wait
from sidecar.telemetry import Hooks, build_hooks
from sidecar.telemetry.logging_setup import configure_logging
from sidecar.telemetry.metric_definitions import Metrics
from sidecar.transport.exchange import UpstreamRequest

REQUEST = UpstreamRequest("POST", URL("http://tool/x"), CIMultiDict({"a": "b"}), b"{}")
INCOMING = CIMultiDict({"content-type": "application/json"})
WAIT = Wait(0.1, "backoff")


def hooks_for(traced: bool) -> Hooks:
    metrics = Metrics(CollectorRegistry())
    if not traced:
        return build_hooks(metrics, environ={})
    from opentelemetry.sdk.trace import TracerProvider

    from sidecar.telemetry.logs import LogSink
    from sidecar.telemetry.metrics import MetricsSink
    from sidecar.telemetry.otel import Tracing
    from sidecar.telemetry.traces import TraceSink

    # The order build_hooks uses: the metrics sink reads the trace sink's exemplars.
    traces = TraceSink(Tracing(TracerProvider(), [], None), llm_model="bench")
    return Hooks([traces, MetricsSink(metrics), LogSink()])


def ordinary(hooks: Hooks) -> None:
    hooks.request_received("weather", "POST", INCOMING)
    hooks.circuit_state("weather", 0)
    hooks.attempt_started(1, REQUEST)
    hooks.attempt_finished("weather", 1, "200", 0.01, None)
    hooks.circuit_state("weather", 0)
    hooks.request_finished("weather", "POST", "ok", 200, 1, 0.02)


def recovered(hooks: Hooks) -> None:
    hooks.request_received("weather", "POST", INCOMING)
    hooks.circuit_state("weather", 0)
    hooks.attempt_started(1, REQUEST)
    hooks.attempt_finished("weather", 1, "503", 0.01, None)
    hooks.retry_scheduled("weather", 1, "503", "server_error", WAIT, None)
    hooks.attempt_started(2, REQUEST)
    hooks.attempt_finished("weather", 2, "200", 0.01, None)
    hooks.circuit_state("weather", 0)
    hooks.request_finished("weather", "POST", "recovered", 200, 2, 0.12, trail="503, 200")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traced", action="store_true")
    args = parser.parse_args()
    with open(os.devnull, "w") as devnull:
        configure_logging("info", "json", stream=devnull)
        hooks = hooks_for(args.traced)
        runs = 20_000 if args.traced else 50_000
        sequences: tuple[Callable[[Hooks], None], ...] = (ordinary, recovered)
        for sequence in sequences:
            sequence(hooks)
            timed = functools.partial(sequence, hooks)
            best = min(timeit.repeat(timed, number=runs, repeat=7)) / runs
            print(f"{'traced ' if args.traced else ''}{sequence.__name__}: {best * 1e6:.2f} µs")


if __name__ == "__main__":
    main()
