"""Instructions per request under callgrind: a CPU figure other people's load cannot move.

On a shared machine wall-clock and CPU-time figures move with whatever else runs; the
number of instructions a request executes does not. Each target (a sidecar tree, the
bare aiohttp proxy) runs under ``valgrind --tool=callgrind`` with counting off while it
starts; wrk then warms it up, counting is switched on with ``callgrind_control`` for a
fixed wrk run (POST, ``--connections``), and off again. Instructions counted over requests
wrk counted is the figure; the nginx upstream and wrk run outside valgrind.

    python bench/instructions.py --tree /tmp/before --tree . --baseline [--traced]

``--traced`` turns tracing on at 100% sampling, exporting to a local OTLP sink.
Under valgrind a request takes some 50 times longer, so rates here mean nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from processes import (
    SIDECAR_ON_LOOPBACK,
    Bench,
    Running,
    free_port,
    tree_command,
    wait_for_port,
)
from run import HERE, LOAD_CORE, PROXY_CORE, PYTHON, start_nginx_upstream, wrk

# Python under valgrind starts in tens of seconds.
START_TIMEOUT_S = 240


def _traced_env(bench: Bench) -> dict[str, str]:
    sink_port = free_port()
    bench.start("otlp-sink", LOAD_CORE, PYTHON, str(HERE / "otlp_sink.py"), str(sink_port))
    wait_for_port(sink_port)
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{sink_port}/v1/traces",
        "OTEL_TRACES_SAMPLER": "always_on",
    }


def _counted(outfile: Path) -> int:
    """The instructions callgrind counted (its ``totals:`` line) in its dumps so far."""
    total = 0
    for dump in outfile.parent.glob(outfile.name + "*"):
        match = re.search(r"^totals:\s+(\d+)", dump.read_text(errors="replace"), re.MULTILINE)
        if match:
            total += int(match.group(1))
    return total


def measure(
    bench: Bench,
    name: str,
    target: tuple[list[str], int],
    env: dict[str, str],
    args: argparse.Namespace,
) -> tuple[int, int]:
    """(instructions, requests) for one target listening on its port, over one wrk run."""
    command, port = target
    outfile = bench.workdir / f"callgrind.{name}.out"
    running: Running = bench.start(
        name,
        PROXY_CORE,
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        # From 0.5 ``serve`` continues in a fresh interpreter (exec, the same PID).
        "--trace-children=yes",
        f"--callgrind-out-file={outfile}",
        *command,
        env={**SIDECAR_ON_LOOPBACK, **env},
    )
    try:
        wait_for_port(port, START_TIMEOUT_S)
        wrk(port, args.connections, args.warmup)
        pid = str(running.process.pid)
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        result = wrk(port, args.connections, args.seconds)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        time.sleep(1)
    finally:
        bench.stop(running)
    return _counted(outfile), result.requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", default=[], help="a sidecar tree")
    parser.add_argument("--baseline", action="store_true", help="also the bare aiohttp proxy")
    parser.add_argument("--traced", action="store_true", help="tracing on, 100%% sampled")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--warmup", type=float, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="instructions-") as workdir:
        bench = Bench(Path(workdir))
        try:
            upstream = start_nginx_upstream(bench)
            env = _traced_env(bench) if args.traced else {}
            targets: list[tuple[str, tuple[list[str], int]]] = []
            if args.baseline:
                port = free_port()
                baseline = [PYTHON, str(HERE / "baseline_proxy.py"), str(port), upstream]
                targets.append(("bare aiohttp", (baseline, port)))
            for tree in args.tree:
                port = free_port()
                targets.append((str(tree), (tree_command(tree.resolve(), upstream, port), port)))
            print("| target | requests | instructions per request |\n|---|---|---|")
            for index, (name, target) in enumerate(targets):
                instructions, requests = measure(bench, f"t{index}", target, env, args)
                per_request = instructions / requests if requests else float("nan")
                print(f"| {name} | {requests} | {per_request:,.0f} |", flush=True)
        finally:
            bench.stop_all()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
