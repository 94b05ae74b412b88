"""Idle private dirty memory of a started sidecar, and what holds it.

Each tree's ``serve`` (as ``run.py`` starts it: ``--upstream``, ``--port``,
``--admin-port``, nothing else) is started ``--rounds`` times, trees interleaved, and
``Private_Dirty`` of ``/proc/PID/smaps_rollup`` (``run.py``'s ``tree_private_dirty_kib``)
is read once ``/healthz`` answers and a second has passed, then again after a second of
wrk at 16 connections through it to an nginx upstream (``run.py``'s figure is this one).

    python bench/idle_memory.py --tree /tmp/before --tree . [--rounds 3]
    python bench/idle_memory.py --by-import [--tree .]

``--by-import`` imports what the served process imports in a fresh interpreter (before
0.5, the command line's whole ``serve``; from 0.5, what ``serve.handoff`` continues with)
and prints the
private dirty memory each package's own modules added while they loaded (a module's
imports counted to themselves, not to it), the largest first: the pages the interpreter
touched building its code, classes and tables.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, tree_serve
from run import PROXY_CORE, start_nginx_upstream, tree_private_dirty_kib, wrk

SETTLE_S = 1.0
MIB = 1024

# Run in the measured interpreter: counts each module's own pages as it loads.
BY_IMPORT = """
import collections, importlib._bootstrap as bootstrap, sys
sys.path.insert(0, {tree!r})

def private_dirty_kib():
    with open("/proc/self/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:"))

load, nested, own = bootstrap._load_unlocked, [0], collections.Counter()

def counted(spec):
    before, outer = private_dirty_kib(), nested[0]
    nested[0] = 0
    try:
        return load(spec)
    finally:
        grown = private_dirty_kib() - before
        own[spec.name.split(".")[0]] += grown - nested[0]
        nested[0] = outer + grown

bootstrap._load_unlocked = counted
started = private_dirty_kib()
try:  # what the served interpreter imports (from 0.5: not the command line's loader)
    import sidecar.serve.handoff, sidecar.serve.server
except ImportError:
    import sidecar.cli, sidecar.config.loader, sidecar.serve.server
assert sidecar.__file__.startswith({tree!r}), sidecar.__file__
print(f"interpreter {{started}}")
for package, kib in own.most_common():
    print(f"{{package}} {{kib}}")
"""


def healthz(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no /healthz on 127.0.0.1:{port}")


def measure_once(bench: Bench, tree: Path, upstream: str) -> tuple[int, int]:
    """(after start, after warm-up) private dirty KiB of one started ``serve``."""
    port, admin_port = free_port(), free_port()
    command = tree_serve(
        tree.resolve(),
        *("--upstream", upstream, "--port", str(port), "--admin-port", str(admin_port)),
    )
    running = bench.start("sidecar", PROXY_CORE, *command, env=SIDECAR_ON_LOOPBACK)
    try:
        healthz(admin_port)
        time.sleep(SETTLE_S)
        started = tree_private_dirty_kib(running.process.pid)
        wrk(port, 16, 1)
        time.sleep(SETTLE_S)
        return started, tree_private_dirty_kib(running.process.pid)
    finally:
        bench.stop(running)


def idle(trees: list[Path], rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="idle-memory-") as workdir:
        bench = Bench(Path(workdir))
        try:
            upstream = start_nginx_upstream(bench)
            figures: dict[Path, list[tuple[int, int]]] = {tree: [] for tree in trees}
            for _ in range(rounds):
                for tree in trees:
                    figures[tree].append(measure_once(bench, tree, upstream))
        finally:
            bench.stop_all()
    print("| tree | started MiB (median) | after 1 s of wrk MiB (median) | rounds |")
    print("|---|---|---|---|")
    for tree, runs in figures.items():
        started = statistics.median(run[0] for run in runs) / MIB
        warm = statistics.median(run[1] for run in runs) / MIB
        every = ", ".join(f"{run[0] / MIB:.1f}/{run[1] / MIB:.1f}" for run in runs)
        print(f"| {tree} | {started:.1f} | {warm:.1f} | {every} |")


def by_import(tree: Path) -> None:
    output = subprocess.run(
        [sys.executable, "-c", BY_IMPORT.format(tree=str(tree.resolve()))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **SIDECAR_ON_LOOPBACK},
    ).stdout.split("\n")
    interpreter = int(output[0].split()[1])
    rows = [(line.split()[0], int(line.split()[1])) for line in output[1:] if line]
    total = interpreter + sum(kib for _, kib in rows)
    print(f"| package | own MiB |\n|---|---|\n| the interpreter | {interpreter / MIB:.2f} |")
    for package, kib in rows[:25]:
        print(f"| {package} | {kib / MIB:.2f} |")
    rest = sum(kib for _, kib in rows[25:])
    print(f"| {len(rows) - 25} more | {rest / MIB:.2f} |\n| all imported | {total / MIB:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", default=[], help="a sidecar tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--by-import", action="store_true", help="what the imports hold")
    args = parser.parse_args()
    trees = args.tree or [Path(".")]
    if args.by_import:
        by_import(trees[0])
    else:
        idle(trees, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
