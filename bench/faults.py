"""Side by side on a fault-injecting tool: Envoy with its best retry policy, the sidecar with
its shipped defaults.

    python bench/faults.py [--calls 50] [--concurrency 10] [--soak-seconds 30]
                           [--sidecar-src DIR] [--out FILE]

For each scenario a fresh proxy of each kind is started in front of the scripted tool in
bench/fault_tool.py, and an agent makes ``--calls`` POST tool calls, ``--concurrency`` at a
time. Then a soak: ``--soak-rate`` calls a second for ``--soak-seconds``, half to an endpoint
that never fails and half to one whose answers are faulty (503 or a reset) at
``--soak-fault-ratio``. Per scenario and proxy: how many calls got the tool's success,
attempts per call as the tool counted them, client-side p50/p99, wrongful retries (an
attempt after a ``retryable: false`` answer, before the HTTP-date a 429 named, or a replay
of a delivered POST the agent did not mark idempotent) and the answers the proxy made up
itself. The sidecar runs through its own CLI with no setting changed but its listen
address (127.0.0.1); ``--sidecar-src DIR`` runs it from the ``sidecar/`` package in DIR instead
of the installed project, to compare the sidecar's code before and after a change. Everything
listens on 127.0.0.1 and every process started is stopped by its PID before the script
returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import envoy
import orjson
from aiohttp import web
from fault_tool import RATE_LIMITED_EARLY, STAMP, FaultTool, Step
from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, tree_serve
from report import Report

BODY = b'{"location": "Tokyo, Japan", "units": "metric", "lat": 35.6, "lon": 139.7}'
CALL_TIMEOUT_S = 30.0  # the agent's own limit on one call
PROXIES = ("envoy", "sidecar")
# Settings that would change the sidecar's behaviour, or Envoy's, if the caller's
# environment happened to hold them.
_FOREIGN_SETTINGS = ("SIDECAR_", "GOMIND_", "OPENAI_", "OTEL_")


@dataclass(frozen=True)
class Scenario:
    key: str  # the path segment that picks the tool's script
    title: str
    script: tuple[Step, ...]
    # The agent sends an Idempotency-Key: replaying a delivered request is allowed.
    idempotent: bool = True
    dead: bool = False  # nothing listens where the tool should be


SCENARIOS = (
    Scenario("burst", "a. 503, 503, then 200", (Step.BUSY_503, Step.BUSY_503, Step.OK)),
    Scenario("envelope", "b. 200 with a SERVICE_ERROR envelope once", (Step.BUSY_IN_200, Step.OK)),
    Scenario("reset", "c. reset once (Idempotency-Key sent)", (Step.RESET, Step.OK)),
    Scenario(
        "reset-post",
        "c2. reset once, POST without Idempotency-Key",
        (Step.RESET, Step.OK),
        idempotent=False,
    ),
    Scenario("stall", "d. 3 s stall once (Idempotency-Key sent)", (Step.STALL, Step.OK)),
    Scenario("dead", "e. dead tool (connect refused)", (Step.OK,), dead=True),
    Scenario("ratelimit", "f. 429 until an HTTP-date Retry-After", (Step.RATE_LIMITED,)),
    Scenario("final", "g. 400 with retryable: false", (Step.NOT_RETRYABLE,)),
)
SOAK_FLAKY, SOAK_STEADY = "soak-flaky", "soak-steady"
Answered = TypeVar("Answered")


@dataclass(frozen=True)
class Call:
    path: str
    latency_ms: float
    status: int | None  # None: no HTTP answer reached the agent
    from_tool: bool
    succeeded: bool  # the tool's own success reached the agent
    said: str  # when the proxy answered by itself: its error code or first words
    proxy_attempts: int | None  # X-Sidecar-Attempts / x-envoy-attempt-count
    outcome: str = ""  # X-Sidecar-Outcome


async def make_call(session: aiohttp.ClientSession, base: str, path: str, idempotent: bool) -> Call:
    headers = {"Content-Type": "application/json"}
    if idempotent:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    started = time.perf_counter()
    try:
        async with session.post(base + path, data=BODY, headers=headers) as response:
            body = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        elapsed = (time.perf_counter() - started) * 1000
        return Call(path, elapsed, None, False, False, f"no answer: {type(exc).__name__}", None)
    elapsed = (time.perf_counter() - started) * 1000
    decoded = _json_object(body)
    from_tool = STAMP in response.headers
    attempts = response.headers.get("X-Sidecar-Attempts") or response.headers.get(
        "x-envoy-attempt-count"
    )
    return Call(
        path=path,
        latency_ms=elapsed,
        status=response.status,
        from_tool=from_tool,
        succeeded=from_tool and 200 <= response.status < 300 and decoded.get("success") is True,
        said="" if from_tool else _what_the_proxy_said(response.status, decoded, body),
        proxy_attempts=int(attempts) if attempts and attempts.isdigit() else None,
        outcome=response.headers.get("X-Sidecar-Outcome", ""),
    )


def _json_object(body: bytes) -> dict[str, object]:
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _what_the_proxy_said(status: int, decoded: dict[str, object], body: bytes) -> str:
    error = decoded.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return f"{status} {error['code']}"
    text = body.decode(errors="replace")
    if "reset reason:" in text:  # Envoy's own answer when no attempt got an answer head
        return f"{status} reset reason: {text.split('reset reason:', 1)[1].split(',')[0].strip()}"
    return " ".join([str(status), *text.split()[:4]])


async def burst(
    session: aiohttp.ClientSession,
    base: str,
    run: str,
    scenario: Scenario,
    calls: int,
    concurrency: int,
) -> list[Call]:
    gate = asyncio.Semaphore(concurrency)

    async def one(number: int) -> Call:
        async with gate:
            path = f"/{run}/{scenario.key}/{number}"
            return await make_call(session, base, path, scenario.idempotent)

    return list(await asyncio.gather(*(one(number) for number in range(calls))))


async def open_loop(
    rate: float, seconds: float, call: Callable[[int], Coroutine[Any, Any, Answered]]
) -> list[Answered]:
    """Open loop: ``call(number)`` every 1/rate s for ``seconds``, whatever the answers do."""
    tasks: list[asyncio.Task[Answered]] = []
    start = time.perf_counter()
    for number in range(int(rate * seconds)):
        delay = start + number / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(call(number)))
    return list(await asyncio.gather(*tasks))


async def soak(
    session: aiohttp.ClientSession, base: str, run: str, rate: float, seconds: float
) -> list[Call]:
    """Alternate endpoints, open loop."""

    async def one(number: int) -> Call:
        endpoint = SOAK_STEADY if number % 2 == 0 else SOAK_FLAKY
        path = f"/{run}/{endpoint}/{number}"
        return await make_call(session, base, path, idempotent=True)

    return await open_loop(rate, seconds, one)


# --- the proxies ---------------------------------------------------------------------


def sidecar_env() -> dict[str, str]:
    """The caller's environment without anything that configures the sidecar: its shipped
    defaults, listening on loopback only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_SETTINGS)}
    return {**env, **SIDECAR_ON_LOOPBACK}


def sidecar_cli() -> str:
    cli = Path(sys.executable).with_name("tool-retry-sidecar")
    if not cli.is_file():
        raise RuntimeError(f"{cli} is missing: install the project first (pip install -e .)")
    return str(cli)


def sidecar_command(sidecar_src: Path | None, *arguments: str) -> list[str]:
    """``tool-retry-sidecar arguments…``: the installed CLI, or the sidecar in ``sidecar_src``."""
    if sidecar_src is None:
        return [sidecar_cli(), *arguments]
    *python, serve = tree_serve(sidecar_src.resolve())  # its command ends with ``serve``
    assert serve == "serve", serve
    return [*python, *arguments]


@contextlib.asynccontextmanager
async def proxy(
    bench: Bench,
    kind: str,
    upstream_port: int,
    settings: Mapping[str, str] | None = None,
    envoy_policy: envoy.RetryPolicy = envoy.BEST_RETRY_POLICY,
    envoy_hedge: bool = False,
    sidecar_src: Path | None = None,
) -> AsyncIterator[str]:
    """A fresh proxy of ``kind`` in front of 127.0.0.1:upstream_port; yields its base URL.

    ``settings`` (``SIDECAR_*`` variables) change the sidecar's shipped defaults;
    ``envoy_policy`` and ``envoy_hedge`` are Envoy's route retry and hedge policies;
    ``sidecar_src`` runs the sidecar from that tree instead of the installed project."""
    port, admin_port = free_port(), free_port()
    if kind == "envoy":
        config = envoy.config(
            port, admin_port, upstream_port, envoy_policy, hedge_on_per_try_timeout=envoy_hedge
        )
        path = envoy.write_config(bench.workdir / f"envoy-{port}.json", config)
        running = bench.start("envoy", None, *envoy.command(path))
        ready = f"http://127.0.0.1:{admin_port}/ready"
    else:
        upstream = f"http://127.0.0.1:{upstream_port}"
        command = sidecar_command(sidecar_src, "serve", "--upstream", upstream)
        command += ["--port", str(port), "--admin-port", str(admin_port)]
        env = {**sidecar_env(), **(settings or {})}
        running = bench.start("sidecar", None, *command, env=env, inherit_env=False)
        ready = f"http://127.0.0.1:{admin_port}/readyz"
    try:
        await _until_ready(bench, ready)
        yield f"http://127.0.0.1:{port}"
    finally:
        await asyncio.to_thread(bench.stop, running)


async def _until_ready(bench: Bench, url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            bench.check_alive()
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:g} s")


def agent_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
    )


# --- the report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    scenario: str
    proxy: str
    success_pct: float
    attempts_per_call: str
    p50_ms: float
    p99_ms: float
    wrongful: int
    proxy_answers: str
    outcomes: str

    def markdown(self) -> str:
        return (
            f"| {self.scenario} | {self.proxy} | {self.success_pct:.1f} | "
            f"{self.attempts_per_call} | {format_ms(self.p50_ms)} | {format_ms(self.p99_ms)} | "
            f"{self.wrongful} | {self.proxy_answers} | {self.outcomes} |"
        )


HEADER = (
    "| scenario | proxy | success % | attempts/call (max) | p50 ms | p99 ms "
    "| wrongful retries | answers the proxy made up | X-Sidecar-Outcome |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def format_ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def counted(labels: Iterable[str]) -> str:
    counts = Counter(label for label in labels if label)
    return ", ".join(f"{label} ×{count}" for label, count in counts.most_common()) or "—"


def wrongful_retries(attempts: Sequence[str], idempotent: bool) -> int:
    """Attempts that should not have reached the tool."""
    wrongful, barred = 0, False
    for did in attempts:
        if barred or did == RATE_LIMITED_EARLY:
            wrongful += 1
        final = did == Step.NOT_RETRYABLE.value
        delivered = did in (Step.RESET.value, Step.STALL.value)
        barred = barred or final or (delivered and not idempotent)
    return wrongful


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)] if ordered else math.nan


def row(
    title: str,
    proxy_name: str,
    calls: Sequence[Call],
    tool: FaultTool,
    idempotent: bool,
    counted_by_proxy: bool = False,
    steady_prefix: str | None = None,
) -> Row:
    seen = [tool.attempts.get(call.path, []) for call in calls]
    if counted_by_proxy:  # nothing reached the tool: the proxy's own count is all there is
        counts = [call.proxy_attempts or 0 for call in calls]
        marker = " †"
    else:
        counts = [len(attempts) for attempts in seen]
        marker = ""
    answers = counted(call.said for call in calls if not call.from_tool)
    if steady_prefix is not None and answers != "—":
        steady = sum(1 for c in calls if not c.from_tool and c.path.startswith(steady_prefix))
        answers += f" ({steady} of them to the endpoint that never fails)"
    latencies = [call.latency_ms for call in calls]
    return Row(
        scenario=title,
        proxy=proxy_name,
        success_pct=100 * sum(call.succeeded for call in calls) / max(len(calls), 1),
        attempts_per_call=f"{sum(counts) / max(len(counts), 1):.2f} ({max(counts, default=0)})"
        + marker,
        p50_ms=percentile(latencies, 0.5),
        p99_ms=percentile(latencies, 0.99),
        wrongful=sum(wrongful_retries(attempts, idempotent) for attempts in seen),
        proxy_answers=answers,
        outcomes=counted(call.outcome for call in calls),
    )


def sidecar_settings(
    settings: Mapping[str, str] | None = None, sidecar_src: Path | None = None
) -> dict[str, object]:
    """What ``check-config`` says the sidecar would run with, given ``settings``."""
    shown = subprocess.run(
        sidecar_command(sidecar_src, "check-config", "--upstream", "http://127.0.0.1:9"),
        capture_output=True,
        text=True,
        check=True,
        env={**sidecar_env(), **(settings or {})},
    ).stdout
    decoded: dict[str, object] = orjson.loads(shown)
    return decoded


def sidecar_defaults(sidecar_src: Path | None = None) -> str:
    settings = sidecar_settings(sidecar_src=sidecar_src)
    keys = (
        "max_retries",
        "retry_window_ms",
        "backoff_base_ms",
        "backoff_max_ms",
        "backoff_jitter",
        "per_try_timeout_ms",
        "request_timeout_ms",
        "retry_budget_ratio",
        "retry_budget_min_per_s",
        "circuit_failures",
        "circuit_min_calls",
        "circuit_open_ms",
    )
    return ", ".join(f"{key}={settings[key]}" for key in keys if key in settings)


async def run(args: argparse.Namespace, say: Callable[[str], None], workdir: Path) -> None:
    scripts = {scenario.key: scenario.script for scenario in SCENARIOS}
    scripts |= {SOAK_FLAKY: (Step.FLAKY,), SOAK_STEADY: (Step.OK,)}
    tool = FaultTool(scripts, flaky_ratio=args.soak_fault_ratio)
    runner = web.AppRunner(tool.app(), access_log=None, handle_signals=False)
    await runner.setup()
    tool_port, dead_port = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", tool_port, backlog=1024).start()
    bench = Bench(workdir)
    rows: list[Row] = []
    try:
        chosen = [s for s in SCENARIOS if not args.only or s.key in args.only.split(",")]
        for scenario in chosen:
            for kind in PROXIES:
                upstream = dead_port if scenario.dead else tool_port
                running = proxy(bench, kind, upstream, sidecar_src=args.sidecar_src)
                async with running as base, agent_session() as session:
                    calls = await burst(session, base, kind, scenario, args.calls, args.concurrency)
                rows.append(
                    row(scenario.title, kind, calls, tool, scenario.idempotent, scenario.dead)
                )
                print(rows[-1].markdown(), file=sys.stderr, flush=True)
        if args.soak_seconds > 0:
            title = (
                f"h. soak: {args.soak_rate:g}/s for {args.soak_seconds:g} s, "
                f"{args.soak_fault_ratio:.0%} of one endpoint's answers faulty"
            )
            for kind in PROXIES:
                running = proxy(bench, kind, tool_port, sidecar_src=args.sidecar_src)
                async with running as base, agent_session() as session:
                    calls = await soak(session, base, kind, args.soak_rate, args.soak_seconds)
                steady = f"/{kind}/{SOAK_STEADY}/"
                rows.append(row(title, kind, calls, tool, True, steady_prefix=steady))
                print(rows[-1].markdown(), file=sys.stderr, flush=True)
    finally:
        await asyncio.to_thread(bench.stop_all)
        await runner.cleanup()
    say(HEADER)
    for each in rows:
        say(each.markdown())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per scenario")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--soak-seconds", type=float, default=30, help="0 skips the soak")
    parser.add_argument("--soak-rate", type=float, default=200, help="calls a second")
    parser.add_argument("--soak-fault-ratio", type=float, default=0.3)
    parser.add_argument(
        "--only",
        help="comma-separated scenario keys: " + ",".join(scenario.key for scenario in SCENARIOS),
    )
    parser.add_argument(
        "--sidecar-src", type=Path, help="run the sidecar from the sidecar/ package in this tree"
    )
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    say = Report()

    started = time.monotonic()
    load_before = os.getloadavg()
    say(f"# Faults side by side: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    say()
    say(
        f"Envoy {envoy.version()} (one worker), retry policy: "
        f"`{orjson.dumps(envoy.BEST_RETRY_POLICY.as_config()).decode()}`."
    )
    say(
        f"Sidecar from {args.sidecar_src or 'the installed project'}, shipped defaults: "
        f"{sidecar_defaults(args.sidecar_src)}."
    )
    say(
        f"{args.calls} calls per scenario, {args.concurrency} at a time, a fresh proxy per "
        f"row; {platform.machine()}, {os.cpu_count()} cores, load average before "
        f"{load_before[0]:.2f}."
    )
    say()
    with tempfile.TemporaryDirectory(prefix="sidecar-faults-") as workdir:
        asyncio.run(run(args, say, Path(workdir)))
    say()
    say(
        "† counted by the proxy (x-envoy-attempt-count, X-Sidecar-Attempts): no attempt "
        "reaches a dead tool. Wrongful retries: attempts after a retryable:false answer, "
        "before the HTTP-date a 429 named, or replays of a delivered POST sent without "
        "Idempotency-Key."
    )
    say.finish(started, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
