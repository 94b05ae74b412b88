"""Where a request's CPU goes, per proxy: user and system time, and the system calls.

Each lane in turn takes ``wrk -c64`` for ``--seconds`` after 1 s of warm-up, pinned to the
proxies' core in front of one nginx upstream on the load core, while ``perf stat`` counts
its system calls by name (kernel tracepoints: no ptrace stops, next to no overhead). Lanes:
Envoy, the bare aiohttp proxy, this tree's sidecar (pure) and, with ``--compiled-tree``, the
compiled build. ``--profile`` adds a second pass sampled by ``perf record``: the share of
the samples in each shared object (the interpreter, the kernel, the compiled modules...).

    python bench/cpu_split.py [--seconds 5] [--compiled-tree DIR] [--profile]

Needs ``perf`` and the right to trace the lanes (root, or perf_event_paranoid ≤ 1).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from processes import Bench, cores_kept_awake
from report import Report
from run import (
    LOAD_CORE,
    PROXY_CORE,
    WrkResult,
    ensure_tools,
    proxy_pid,
    start_nginx_upstream,
    start_proxy_lanes,
    tree_user_and_system_s,
    wrk,
)

# System calls a lane makes fewer of than this per request are left out of the table.
_SHOWN_PER_REQUEST = 0.05


def under_perf(pid: int, perf_arguments: list[str], port: int, seconds: float) -> WrkResult:
    """``wrk -c64`` against ``port`` while ``perf`` watches ``pid`` for the same time."""
    perf = subprocess.Popen(
        ["perf", *perf_arguments, "-p", str(pid), "--", "sleep", str(seconds + 0.5)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return wrk(port, 64, seconds)
    finally:
        perf.wait()


def syscalls_by_name(counts: Path) -> collections.Counter[str]:
    """``perf stat -x,`` output of the ``syscalls:sys_enter_*`` tracepoints, by call."""
    calls: collections.Counter[str] = collections.Counter()
    for line in counts.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit() and "sys_enter_" in fields[2]:
            calls[fields[2].split("sys_enter_", 1)[1]] += int(fields[0])
    return calls


def shares_by_object(samples: Path) -> list[tuple[float, str]]:
    """``perf report``'s share of the samples per shared object, largest first."""
    report = subprocess.run(
        ["perf", "report", "-i", str(samples), "--no-children", "--sort", "dso", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shares = re.findall(r"^\s+([\d.]+)%\s+(\S+)", report, re.MULTILINE)
    return [(float(share), name) for share, name in shares]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--compiled-tree", type=Path, help="bench/compiled_tree.py's build")
    parser.add_argument("--profile", action="store_true", help="perf record each lane too")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("needs perf (Debian: linux-perf)")
    ensure_tools()
    say = Report()
    trees = {"sidecar compiled": args.compiled_tree.resolve()} if args.compiled_tree else {}
    with (
        cores_kept_awake([PROXY_CORE, LOAD_CORE]),
        tempfile.TemporaryDirectory(prefix="sidecar-cpu-") as workdir,
    ):
        bench = Bench(Path(workdir))
        try:
            ports = start_proxy_lanes(bench, start_nginx_upstream(bench), trees)
            say(f"`wrk -c64 -d{args.seconds:g}s` per lane; per request:")
            say()
            say("| lane | req/s | user µs | system µs | system calls (per request) |")
            say("|---|---|---|---|---|")
            profiles: dict[str, list[tuple[float, str]]] = {}
            for lane, port in ports.items():
                pid = proxy_pid(bench, lane)
                wrk(port, 16, 1)  # warm up: pools filled, code paths hot
                counts = Path(workdir) / f"{lane}.calls"
                user_before, system_before = tree_user_and_system_s(pid)
                tracepoints = ["stat", "-x,", "-e", "syscalls:sys_enter_*", "-o", str(counts)]
                result = under_perf(pid, tracepoints, port, args.seconds)
                user_after, system_after = tree_user_and_system_s(pid)
                per_request = 1e6 / result.requests
                calls = ", ".join(
                    f"{name} {count / result.requests:.2f}"
                    for name, count in syscalls_by_name(counts).most_common()
                    if count / result.requests >= _SHOWN_PER_REQUEST
                )
                say(
                    f"| {lane} | {result.requests_per_s:,.0f} | "
                    f"{(user_after - user_before) * per_request:.0f} | "
                    f"{(system_after - system_before) * per_request:.0f} | {calls} |"
                )
                if args.profile:
                    samples = Path(workdir) / f"{lane}.perf"
                    under_perf(pid, ["record", "-F", "999", "-o", str(samples)], port, 3)
                    profiles[lane] = shares_by_object(samples)
                bench.check_alive()
            if profiles:
                say()
                say("Samples by shared object (`perf record -F 999`, 3 s of the same load):")
                say()
                for lane, shares in profiles.items():
                    top = ", ".join(f"{name} {share:.0f}%" for share, name in shares[:6])
                    say(f"- {lane}: {top}")
        finally:
            bench.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
