"""The benchmark: the sidecar beside its anchors, in one run, on this machine.

    python bench/run.py [--quick] [--out bench/results.md]

Starts an nginx upstream (fixed JSON) and aiohttp upstreams (slow, half failing), then,
side by side with rounds interleaved: (a) direct to the upstream, (b) nginx as a reverse
proxy, (c) HAProxy, (d) the minimal aiohttp pass-through proxy in bench/baseline_proxy.py,
(e) the sidecar. wrk POSTs a small JSON body at 16 and 64 connections; proxies are pinned
to core 0, wrk and the upstreams to core 1. Then: the added p50 latency at a fixed 1k req/s,
RSS with 1000 requests in flight against an upstream that sleeps 200 ms, and a retry-heavy
run against an upstream that answers 503 half the time. Everything listens on 127.0.0.1
and is stopped (by PID) before the script returns. Installs nginx, HAProxy and wrk with
apt-get when they are missing. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
PROXY_CORE, LOAD_CORE = "0", "1"
NGINX_UPSTREAM, SLOW_UPSTREAM, FLAKY_UPSTREAM = 18101, 18102, 18103
PORTS = {
    "direct": NGINX_UPSTREAM,
    "nginx": 18111,
    "haproxy": 18112,
    "baseline": 18113,
    "sidecar": 18114,
}
SIDECAR_ADMIN = 18124
SLOW_PORTS = {"baseline": 18133, "sidecar": 18134}
FLAKY_SIDECAR, FLAKY_ADMIN = 18144, 18145
OK_JSON = '{"success": true, "data": {"temp_c": 21.5, "location": "Tokyo, Japan"}}'


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Bench:
    workdir: Path
    running: list[Running] = field(default_factory=list)

    def start(
        self, name: str, core: str, *command: str, env: dict[str, str] | None = None
    ) -> Running:
        with open(self.workdir / f"{name}.err", "wb") as errors:
            process = subprocess.Popen(
                ["taskset", "-c", core, *command],
                stdout=subprocess.DEVNULL,
                stderr=errors,
                env={**os.environ, **(env or {})},
            )
        running = Running(name, process)
        self.running.append(running)
        return running

    def check_alive(self) -> None:
        """Stop with the process's own words if anything we started has died."""
        for running in self.running:
            if running.process.poll() is not None:
                errors = (self.workdir / f"{running.name}.err").read_text(errors="replace")
                raise RuntimeError(f"{running.name} exited: {errors[-2000:]}")

    def stop_all(self) -> None:
        for running in reversed(self.running):
            running.stop()
        self.running.clear()


def ensure_tools() -> None:
    missing = [tool for tool in ("nginx", "haproxy", "wrk", "taskset") if not shutil.which(tool)]
    if not missing:
        return
    print(f"installing {' '.join(missing)} with apt-get", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx", "haproxy", "wrk"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def wait_for_port(port: int, timeout_s: float = 20) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def nginx_config(workdir: Path, name: str, body: str) -> Path:
    path = workdir / f"{name}.conf"
    path.write_text(
        textwrap.dedent(
            f"""
            worker_processes 1;
            daemon off;
            pid {workdir}/{name}.pid;
            error_log {workdir}/{name}.log warn;
            events {{ worker_connections 8192; }}
            http {{
              access_log off;
              client_body_temp_path {workdir}/{name}-body;
              proxy_temp_path {workdir}/{name}-proxy;
              {body}
            }}
            """
        )
    )
    return path


def all_ports() -> list[int]:
    return [
        *PORTS.values(),
        SIDECAR_ADMIN,
        SLOW_UPSTREAM,
        *SLOW_PORTS.values(),
        SLOW_PORTS["sidecar"] + 100,
        FLAKY_UPSTREAM,
        FLAKY_SIDECAR,
        FLAKY_ADMIN,
    ]


def ensure_ports_free() -> None:
    import socket

    for port in all_ports():
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"127.0.0.1:{port} is in use: stop what listens there first")


def start_everything(bench: Bench) -> None:
    ensure_ports_free()
    workdir = bench.workdir
    upstream = nginx_config(
        workdir,
        "upstream",
        f"""server {{ listen 127.0.0.1:{NGINX_UPSTREAM} backlog=4096;
              location / {{ default_type application/json; return 200 '{OK_JSON}'; }} }}""",
    )
    bench.start("nginx-upstream", LOAD_CORE, "nginx", "-c", str(upstream), "-p", str(workdir))
    proxy = nginx_config(
        workdir,
        "proxy",
        f"""upstream tool {{ server 127.0.0.1:{NGINX_UPSTREAM}; keepalive 128; }}
            server {{ listen 127.0.0.1:{PORTS["nginx"]} backlog=4096;
              location / {{ proxy_pass http://tool; proxy_http_version 1.1;
                           proxy_set_header Connection ""; }} }}""",
    )
    bench.start("nginx-proxy", PROXY_CORE, "nginx", "-c", str(proxy), "-p", str(workdir))
    haproxy = workdir / "haproxy.cfg"
    haproxy.write_text(
        textwrap.dedent(
            f"""
            global
              nbthread 1
              maxconn 8000
            defaults
              mode http
              timeout connect 5s
              timeout client 60s
              timeout server 60s
              option http-keep-alive
            frontend agents
              bind 127.0.0.1:{PORTS["haproxy"]}
              default_backend tool
            backend tool
              http-reuse always
              server upstream 127.0.0.1:{NGINX_UPSTREAM}
            """
        )
    )
    bench.start("haproxy", PROXY_CORE, "haproxy", "-db", "-f", str(haproxy))
    nginx_url = f"http://127.0.0.1:{NGINX_UPSTREAM}"
    bench.start(
        "baseline",
        PROXY_CORE,
        PYTHON,
        str(HERE / "baseline_proxy.py"),
        str(PORTS["baseline"]),
        nginx_url,
    )
    bench.start("sidecar", PROXY_CORE, *sidecar_command(nginx_url, PORTS["sidecar"], SIDECAR_ADMIN))
    bench.start(
        "slow-upstream",
        LOAD_CORE,
        PYTHON,
        str(HERE / "upstream.py"),
        str(SLOW_UPSTREAM),
        "--delay-ms",
        "200",
    )
    slow_url = f"http://127.0.0.1:{SLOW_UPSTREAM}"
    bench.start(
        "slow-baseline",
        PROXY_CORE,
        PYTHON,
        str(HERE / "baseline_proxy.py"),
        str(SLOW_PORTS["baseline"]),
        slow_url,
    )
    bench.start(
        "slow-sidecar",
        PROXY_CORE,
        *sidecar_command(slow_url, SLOW_PORTS["sidecar"], SLOW_PORTS["sidecar"] + 100),
    )
    bench.start(
        "flaky-upstream",
        LOAD_CORE,
        PYTHON,
        str(HERE / "upstream.py"),
        str(FLAKY_UPSTREAM),
        "--fail-ratio",
        "0.5",
    )
    bench.start(
        "flaky-sidecar",
        PROXY_CORE,
        *sidecar_command(f"http://127.0.0.1:{FLAKY_UPSTREAM}", FLAKY_SIDECAR, FLAKY_ADMIN),
        env={
            # Measure the engine's own cost: retry every failure at once, budget and circuit
            # out of the way.
            "SIDECAR_BACKOFF_BASE_MS": "0",
            "SIDECAR_BACKOFF_MAX_MS": "0",
            "SIDECAR_RETRY_BUDGET_RATIO": "10",
            "SIDECAR_CIRCUIT_FAILURES": "0",
            "SIDECAR_MAX_RETRIES": "10",
        },
    )
    for port in [
        *PORTS.values(),
        SIDECAR_ADMIN,
        SLOW_UPSTREAM,
        *SLOW_PORTS.values(),
        FLAKY_UPSTREAM,
        FLAKY_SIDECAR,
        FLAKY_ADMIN,
    ]:
        wait_for_port(port)


def sidecar_command(upstream: str, port: int, admin_port: int) -> list[str]:
    return [
        PYTHON,
        "-m",
        "sidecar",
        "serve",
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--admin-port",
        str(admin_port),
    ]


@dataclass
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    non_2xx: int


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(port: int, connections: int, seconds: float, path: str = "/tool") -> WrkResult:
    output = subprocess.run(
        [
            "taskset",
            "-c",
            LOAD_CORE,
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(HERE / "post.lua"),
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def latency(percent: str) -> float:
        match = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
        return float(match.group(1)) * _UNITS[match.group(2)] if match else float("nan")

    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    return WrkResult(
        float(rate.group(1)) if rate else 0.0,
        latency("50"),
        latency("99"),
        int(non_2xx.group(1)) if non_2xx else 0,
    )


def tree_rss_kib(pid: int) -> int:
    """RSS of a process and its children (nginx's and HAProxy's workers)."""
    pids = {pid}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.add(int(entry))
    total = 0
    for member in pids:
        with contextlib.suppress(OSError), open(f"/proc/{member}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def proxy_pid(bench: Bench, name: str) -> int:
    """The PID behind ``taskset``: taskset execs the command, so it is the same process."""
    return next(running.process.pid for running in bench.running if running.name == name)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_kib(pid))
            stop.wait(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def metrics_sum(port: int, name: str, **labels: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def fixed_rate_latencies(port: int, rate: int, seconds: float) -> list[float]:
    """Open-loop load: one request every 1/rate s, whatever the answers do; latency of each."""
    import aiohttp

    body = (HERE / "post.lua").read_text().split("wrk.body = '", 1)[1].split("'", 1)[0]
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            started = time.perf_counter()
            async with session.post(
                f"http://127.0.0.1:{port}/tool",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as response:
                await response.read()
            latencies.append((time.perf_counter() - started) * 1000)

        tasks = []
        start = time.perf_counter()
        for number in range(int(rate * seconds)):
            delay = start + number / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return latencies


def fixed_rate_p50(port: int, rate: int, seconds: float) -> float:
    command = [
        PYTHON,
        "-c",
        f"import asyncio, statistics, sys; sys.path.insert(0, {str(HERE)!r}); import run;"
        f"print(statistics.median(asyncio.run(run.fixed_rate_latencies({port}, {rate}, "
        f"{seconds}))))",
    ]
    output = subprocess.run(
        ["taskset", "-c", LOAD_CORE, *command], capture_output=True, text=True, check=True
    ).stdout
    return float(output.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--out", default=str(HERE / "results.md"))
    args = parser.parse_args()
    rounds, seconds = (1, 3.0) if args.quick else (args.rounds, args.seconds)
    if (os.cpu_count() or 1) < 2:
        print("needs two cores: one for the proxies, one for the load", file=sys.stderr)
        return 2
    ensure_tools()
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as workdir:
        bench = Bench(Path(workdir))
        try:
            start_everything(bench)
            say(f"# Benchmark: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            say()
            say(
                f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
                f"{platform.python_implementation()} {platform.python_version()}, "
                f"{_cpu_model()}. Proxies on core {PROXY_CORE}; wrk and upstreams on core "
                f"{LOAD_CORE}. {rounds} interleaved round(s) of {seconds:g} s per cell; the "
                "median round is shown."
            )
            say()
            targets = ["direct", "nginx", "haproxy", "baseline", "sidecar"]
            results: dict[tuple[str, int], list[WrkResult]] = {}
            for target in targets:  # warm up: pools filled, code paths hot
                wrk(PORTS[target], 16, 1)
            for _ in range(rounds):
                for connections in (16, 64):
                    for target in targets:
                        result = wrk(PORTS[target], connections, seconds)
                        results.setdefault((target, connections), []).append(result)
            rss = {
                target: tree_rss_kib(proxy_pid(bench, _process_of(target))) for target in targets
            }
            say("| target | c | req/s | p50 ms | p99 ms | non-2xx | RSS MiB |")
            say("|---|---|---|---|---|---|---|")
            medians: dict[tuple[str, int], WrkResult] = {}
            for connections in (16, 64):
                for target in targets:
                    runs = sorted(results[(target, connections)], key=lambda r: r.requests_per_s)
                    median = runs[len(runs) // 2]
                    medians[(target, connections)] = median
                    say(
                        f"| {target} | {connections} | {median.requests_per_s:,.0f} | "
                        f"{median.p50_ms:.2f} | {median.p99_ms:.2f} | {median.non_2xx} | "
                        f"{rss[target] / 1024:.0f} |"
                    )
            say()
            for connections in (16, 64):
                sidecar = medians[("sidecar", connections)].requests_per_s
                say(
                    f"- c={connections}: sidecar/baseline = "
                    f"{sidecar / medians[('baseline', connections)].requests_per_s:.2f}, "
                    "sidecar/nginx = "
                    f"{sidecar / medians[('nginx', connections)].requests_per_s:.2f}, "
                    f"sidecar/haproxy = "
                    f"{sidecar / medians[('haproxy', connections)].requests_per_s:.2f}"
                )
            say()

            rate, duration = 1000, (3.0 if args.quick else 5.0)
            direct_p50 = fixed_rate_p50(PORTS["direct"], rate, duration)
            sidecar_p50 = fixed_rate_p50(PORTS["sidecar"], rate, duration)
            baseline_p50 = fixed_rate_p50(PORTS["baseline"], rate, duration)
            say(
                f"Fixed {rate} req/s for {duration:g} s: p50 direct {direct_p50:.2f} ms, "
                f"through the sidecar {sidecar_p50:.2f} ms (added {sidecar_p50 - direct_p50:.2f} "
                f"ms), through the baseline {baseline_p50:.2f} ms (added "
                f"{baseline_p50 - direct_p50:.2f} ms)."
            )
            say()

            say("Slow upstream (sleeps 200 ms), wrk holding N requests in flight:")
            say()
            say("| proxy | in flight | req/s | p50 ms | peak RSS MiB |")
            say("|---|---|---|---|---|")
            peaks: dict[tuple[str, int], int] = {}
            for connections in (100, 1000):
                for name, port in SLOW_PORTS.items():
                    with peak_rss(proxy_pid(bench, f"slow-{name}")) as peak:
                        result = wrk(port, connections, max(seconds, 5))
                    peaks[(name, connections)] = peak[0]
                    say(
                        f"| {name} | {connections} | {result.requests_per_s:,.0f} | "
                        f"{result.p50_ms:.0f} | {peak[0] / 1024:.0f} |"
                    )
            for name in SLOW_PORTS:
                per_request = (peaks[(name, 1000)] - peaks[(name, 100)]) * 1024 / 900
                say(f"- {name}: {per_request / 1024:.1f} KiB more RSS per extra request in flight")
            say()

            flaky_pid = proxy_pid(bench, "flaky-sidecar")
            retries_before = metrics_sum(FLAKY_ADMIN, "sidecar_retries_total")
            recovered_before = metrics_sum(
                FLAKY_ADMIN, "sidecar_requests_total", outcome="recovered"
            )
            cpu_before = cpu_seconds(flaky_pid)
            result = wrk(FLAKY_SIDECAR, 64, seconds)
            cpu = cpu_seconds(flaky_pid) - cpu_before
            retries = metrics_sum(FLAKY_ADMIN, "sidecar_retries_total") - retries_before
            recovered = (
                metrics_sum(FLAKY_ADMIN, "sidecar_requests_total", outcome="recovered")
                - recovered_before
            )
            say(
                f"Retry-heavy (upstream answers 503 half the time, c=64, retries at once): "
                f"{result.requests_per_s:,.0f} req/s to the agent, "
                f"{retries / seconds:,.0f} retries/s, {result.non_2xx} non-2xx answers, "
                f"{cpu / max(recovered, 1) * 1e6:.0f} µs of sidecar CPU per recovered request "
                f"({recovered:,.0f} recovered)."
            )
        finally:
            bench.stop_all()
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


def _process_of(target: str) -> str:
    return {"direct": "nginx-upstream", "nginx": "nginx-proxy"}.get(target, target)


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
