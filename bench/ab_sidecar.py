"""Two sidecar trees side by side with the bare aiohttp proxy, rounds interleaved.

For a change to the hot path: ``--before`` is another checkout of the project (e.g.
``git archive main | tar -x -C /tmp/before``), the "after" is this one. Each proxy is
pinned to core 0, wrk and the nginx upstream to core 1, as in ``run.py``; ports are
whatever is free, so a run does not collide with another benchmark. ``--tool-delay-ms``
puts a tool that answers that much later (``upstream.py``) in nginx's place, for requests
held in flight (``--connections 1000``).

    python bench/ab_sidecar.py --before /tmp/before --rounds 3 --seconds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, tree_command, wait_for_port
from run import (
    HERE,
    LOAD_CORE,
    PROXY_CORE,
    PYTHON,
    WrkResult,
    proxy_pid,
    start_bare_proxy,
    start_nginx_upstream,
    tree_private_dirty_kib,
    wrk,
    wrk_with_cpu,
)

TARGETS = ("baseline", "before", "after")


def start(bench: Bench, before: Path, tool_delay_ms: int) -> dict[str, int]:
    ports = {name: free_port() for name in TARGETS}
    if tool_delay_ms:
        port = free_port()
        slow_tool = [str(HERE / "upstream.py"), str(port), "--delay-ms", str(tool_delay_ms)]
        bench.start("upstream", LOAD_CORE, PYTHON, *slow_tool)
        wait_for_port(port)
        upstream_url = f"http://127.0.0.1:{port}"
    else:
        upstream_url = start_nginx_upstream(bench)
    start_bare_proxy(bench, "baseline", ports["baseline"], upstream_url)
    for name, tree in (("before", before), ("after", HERE.parent)):
        command = tree_command(tree, upstream_url, ports[name])
        bench.start(name, PROXY_CORE, *command, env=SIDECAR_ON_LOOPBACK)
    for port in ports.values():
        wait_for_port(port)
    return ports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other sidecar tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--tool-delay-ms",
        type=int,
        default=0,
        help="a tool that answers after this long (bench/upstream.py) instead of nginx",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ab-sidecar-") as workdir:
        bench = Bench(Path(workdir))
        try:
            ports = start(bench, args.before.resolve(), args.tool_delay_ms)
            pids = {target: proxy_pid(bench, target) for target in TARGETS}
            idle_kib = {target: tree_private_dirty_kib(pids[target]) for target in TARGETS}
            for target in TARGETS:  # warm up: pools filled, code paths hot
                wrk(ports[target], args.connections, 1)
            results: dict[str, list[WrkResult]] = {target: [] for target in TARGETS}
            for number in range(args.rounds):
                for target in TARGETS:
                    result = wrk_with_cpu(
                        pids[target], ports[target], args.connections, args.seconds
                    )
                    bench.check_alive()
                    results[target].append(result)
                    print(
                        f"round {number + 1} {target:8} {result.requests_per_s:8.0f} req/s "
                        f"{result.cpu_s_per_10k:5.2f} CPU-s/10k p50 {result.p50_ms:6.2f} ms "
                        f"non-2xx {result.non_2xx} timed out {result.timeouts} others on core 0 "
                        f"{result.others_on_core_pct:4.1f}%",
                        flush=True,
                    )
        finally:
            bench.stop_all()
    report(results, idle_kib, args)
    return 0


def report(
    results: dict[str, list[WrkResult]], idle_kib: dict[str, int], args: argparse.Namespace
) -> None:
    rate = {t: statistics.median(r.requests_per_s for r in results[t]) for t in TARGETS}
    cpu = {t: statistics.median(r.cpu_s_per_10k for r in results[t]) for t in TARGETS}
    p50 = {t: statistics.median(r.p50_ms for r in results[t]) for t in TARGETS}
    print(
        f"\nmedians of {args.rounds} rounds of {args.seconds:g} s, c={args.connections}\n"
        "| target | req/s | x bare aiohttp | CPU-s/10k | x bare aiohttp | p50 ms "
        "| idle private dirty MiB |\n"
        "|---|---|---|---|---|---|---|"
    )
    for target in TARGETS:
        print(
            f"| {target} | {rate[target]:.0f} | {rate[target] / rate['baseline']:.2f} "
            f"| {cpu[target]:.2f} | {cpu[target] / cpu['baseline']:.2f} "
            f"| {p50[target]:.2f} | {idle_kib[target] / 1024:.1f} |"
        )
    print(
        f"\nafter/before: req/s {rate['after'] / rate['before']:.2f}x, "
        f"CPU per request {cpu['after'] / cpu['before']:.2f}x"
    )


if __name__ == "__main__":
    sys.exit(main())
