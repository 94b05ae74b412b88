"""What tracing costs: the sidecar before the tracing change, with tracing off, and on.

    python bench/tracing.py [--rounds 3] [--seconds 4]

Three sidecars in front of one aiohttp upstream: (before) the code at the commit this
branch started from, extracted with ``git archive``; (off) this code without any OTEL_*
variable; (on) this code exporting every span (``OTEL_TRACES_SAMPLER=always_on``) over
OTLP/HTTP to a collector that decodes each export (bench/otlp_sink.py). wrk POSTs a
small JSON body at 16 connections, rounds interleaved; the sidecars run on core 0, wrk,
the upstream and the collector on core 1. Reported: the median requests/s of each, the
ratios off/before, on/off and on/before (throughput, and the sidecar's CPU time per
request, which other load on the machine disturbs less), and each sidecar's idle private
dirty memory. Everything listens
on 127.0.0.1 and is stopped by PID before the script returns. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, wait_for_port
from run import (
    HERE,
    LOAD_CORE,
    PROXY_CORE,
    PYTHON,
    sidecar_command,
    tree_private_dirty_kib,
    wrk_with_cpu,
)

REPO = HERE.parent
VARIANTS = ("before", "off", "on")


def _branch_point() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _extract(commit: str, into: Path) -> None:
    """The sidecar package as it was at ``commit``, importable from ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "sidecar"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4)
    args = parser.parse_args()
    clean = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        before_code = workdir / "before"
        before_code.mkdir()
        commit = _branch_point()
        _extract(commit, before_code)
        bench = Bench(workdir)
        try:
            upstream, collector = free_port(), free_port()
            bench.start("upstream", LOAD_CORE, PYTHON, str(HERE / "upstream.py"), str(upstream))
            bench.start("collector", LOAD_CORE, PYTHON, str(HERE / "otlp_sink.py"), str(collector))
            environments = {
                "before": {**clean, "PYTHONPATH": str(before_code)},
                "off": clean,
                "on": {
                    **clean,
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{collector}/v1/traces",
                    "OTEL_TRACES_SAMPLER": "always_on",
                },
            }
            ports = {}
            for name in VARIANTS:
                ports[name] = free_port()
                bench.start(
                    name,
                    PROXY_CORE,
                    *sidecar_command(f"http://127.0.0.1:{upstream}", ports[name], free_port()),
                    env={**environments[name], **SIDECAR_ON_LOOPBACK},
                    inherit_env=False,
                )
            for port in (upstream, collector, *ports.values()):
                wait_for_port(port)
            idle_kib = {
                name: tree_private_dirty_kib(running.process.pid)
                for running in bench.running
                if (name := running.name) in VARIANTS
            }
            pids = {r.name: r.process.pid for r in bench.running}
            rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
            cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for _ in range(args.rounds):
                for name in VARIANTS:
                    result = wrk_with_cpu(pids[name], ports[name], 16, args.seconds)
                    bench.check_alive()
                    rates[name].append(result.requests_per_s)
                    cpu[name].append(result.cpu_s_per_10k)
            spans = int(urllib.request.urlopen(f"http://127.0.0.1:{collector}/count").read())
        finally:
            bench.stop_all()
    median = {name: statistics.median(values) for name, values in rates.items()}
    cpu_median = {name: statistics.median(values) for name, values in cpu.items()}
    print(f"before = {commit[:10]}; {args.rounds} rounds of {args.seconds:g} s, 16 connections")
    for name in VARIANTS:
        rounds = ", ".join(f"{value:.0f}" for value in rates[name])
        print(
            f"{name:>6}: median {median[name]:.0f} req/s ({rounds}); "
            f"CPU {cpu_median[name]:.2f} s per 10k requests; "
            f"idle private dirty memory {idle_kib[name] / 1024:.1f} MiB"
        )
    for over, under in (("off", "before"), ("on", "off"), ("on", "before")):
        print(
            f"{over} / {under}: throughput {median[over] / median[under]:.3f}, "
            f"CPU per request {cpu_median[over] / cpu_median[under]:.3f}"
        )
    print(f"spans the collector decoded: {spans}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
