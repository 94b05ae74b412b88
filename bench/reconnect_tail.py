"""The p99 at c=64 when agents reconnect to a busy proxy: rounds of wrk back to back.

Each round is a new wrk process, so 64 new connections arrive together while the proxy
is still answering the last round's (wrk exits with 64 requests in flight). A proxy that
accepts one connection per turn of its loop, as uvloop's libuv does since 1.45, leaves the
last of them waiting dozens of busy turns for their accept; their first requests make the
round's p99 and its max. `bench/run.py` leaves other proxies' rounds between two of the
same target's, which hides this.

    python bench/reconnect_tail.py [--rounds 8] [--seconds 3] [--before TREE]

``--before`` adds a lane serving the sidecar from another tree (0.5.0's, say). Every lane
runs on the proxies' core against one nginx upstream on the load core, one lane after
another, each after 1 s of warm-up; the cores are kept from halting as in run.py.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from processes import Bench, cores_kept_awake
from report import Report
from run import LOAD_CORE, PROXY_CORE, ensure_tools, start_nginx_upstream, start_proxy_lanes, wrk


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--before", type=Path, help="a tree whose sidecar is a lane too")
    args = parser.parse_args()
    ensure_tools()
    say = Report()
    with (
        cores_kept_awake([PROXY_CORE, LOAD_CORE]),
        tempfile.TemporaryDirectory(prefix="sidecar-tail-") as workdir,
    ):
        bench = Bench(Path(workdir))
        try:
            upstream = start_nginx_upstream(bench)
            trees = {"sidecar before": args.before.resolve()} if args.before else {}
            ports = start_proxy_lanes(bench, upstream, trees)
            say(
                f"{args.rounds} rounds of `wrk -c64 -d{args.seconds:g}s` back to back per lane "
                "(p50 / p99 / max ms, req/s):"
            )
            say()
            say("| lane | rounds | median p99 ms | worst max ms | rounds with p99 > 100 ms |")
            say("|---|---|---|---|---|")
            for lane, port in ports.items():
                wrk(port, 16, 1)  # warm up: pools filled, code paths hot
                results = [wrk(port, 64, args.seconds) for _ in range(args.rounds)]
                bench.check_alive()
                rounds = ", ".join(
                    f"{r.p50_ms:.0f}/{r.p99_ms:.0f}/{r.max_ms:.0f} {r.requests_per_s:,.0f}"
                    for r in results
                )
                say(
                    f"| {lane} | {rounds} | {statistics.median(r.p99_ms for r in results):.0f} "
                    f"| {max(r.max_ms for r in results):.0f} "
                    f"| {sum(r.p99_ms > 100 for r in results)} of {len(results)} |"
                )
        finally:
            bench.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
