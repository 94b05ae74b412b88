"""Hedged reads: a tool slow on 1 call in 20, behind the sidecar with hedging off and on, and
behind Envoy with its hedge policy.

    python bench/hedging.py [--calls 400] [--concurrency 4] [--multiples 1,1.5,2] [--out FILE]

The tool (aiohttp, in this process) answers after ``--fast-ms``, or after ``--slow-ms`` on
``--slow-ratio`` of the calls: a seeded sample of that share of the call numbers is slow on
its first request, and a copy is slow on a seeded draw of its own at the same ratio. Every
row meets the same slow calls, and a copy of a slow call is usually fast. Per row an agent
makes ``--calls`` calls, ``--concurrency`` at a time, through a fresh proxy. First straight
to the tool, then through the sidecar with hedging off, whose p50 is the anchor: 95% of
the calls are fast, so it is the fast calls' p50 through the sidecar. Then, for each of
``--multiples`` of that p50 as the hedge delay (whole milliseconds, rounded up): the
sidecar with ``SIDECAR_HEDGE_AFTER_MS`` set and nothing else changed, and Envoy with
``hedge_on_per_try_timeout`` and that per-try timeout. Last, at the shortest delay, POSTs
without ``Idempotency-Key`` (never safe to copy) and with one, through both. Tool calls
per agent call are counted at the tool. Everything listens on 127.0.0.1 and every process
started is stopped by its PID before the script returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import envoy
import orjson
from aiohttp import web
from faults import agent_session, counted, format_ms, percentile, proxy, sidecar_settings
from multidict import CIMultiDictProxy
from processes import Bench, free_port
from report import Report

HEDGE_SETTING = "SIDECAR_HEDGE_AFTER_MS"
BODY = b'{"query": "weather in Tokyo", "limit": 3}'
# Done when (issue 25): p99 at most this many times p50, at most this many tool calls per
# agent call.
P99_OVER_P50, CALLS_PER_CALL = 2.0, 1.15


@dataclass
class SlowSometimes:
    """A read-only tool that is slow on ``slow_ratio`` of the calls it receives.

    The calls slow on their first request are a seeded sample of exactly ``slow_ratio`` of
    the ``calls`` numbers; a later request of a call (a copy) is slow on a draw of its own,
    seeded with the call's number and its place: every row meets the same slow calls and
    the same slow copies, however the requests interleave."""

    fast_s: float
    slow_s: float
    slow_ratio: float
    calls: int
    seed: int = 20
    # Per agent call (the ``call`` query parameter): requests that reached the tool.
    received: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        sample = random.Random(self.seed).sample(range(self.calls), self.slow_calls)
        self._slow_first = {str(number) for number in sample}

    @property
    def slow_calls(self) -> int:
        return round(self.calls * self.slow_ratio)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/search", self._answer)
        return app

    def is_slow(self, number: str, attempt: int) -> bool:
        if attempt == 0:
            return number in self._slow_first
        return random.Random(f"{self.seed}/{number}/{attempt}").random() < self.slow_ratio

    async def _answer(self, request: web.Request) -> web.Response:
        await request.read()
        key = request.query["call"]
        attempt = self.received[key]
        self.received[key] += 1
        slow = self.is_slow(key.rpartition(".")[2], attempt)
        await asyncio.sleep(self.slow_s if slow else self.fast_s)
        return web.json_response({"success": True, "data": {"results": ["a", "b", "c"]}})


@dataclass(frozen=True)
class Plan:
    target: str  # "direct", "sidecar" or "envoy"
    hedge_ms: int = 0  # 0: no hedging
    method: str = "GET"
    keyed: bool = False  # the agent sends an Idempotency-Key

    @property
    def call(self) -> str:
        if self.method != "POST":
            return self.method
        return "POST with Idempotency-Key" if self.keyed else "POST, no Idempotency-Key"

    @property
    def through(self) -> str:
        return {"direct": "the tool directly", "sidecar": "sidecar", "envoy": "Envoy"}[self.target]


@dataclass(frozen=True)
class Call:
    key: str  # the ``call`` query parameter: how the tool tells agent calls apart
    latency_ms: float
    status: int | None  # None: no HTTP answer reached the agent
    copied: bool  # the proxy says a second attempt went out


async def make_calls(
    session: aiohttp.ClientSession, base: str, plan: Plan, row: str, count: int, concurrency: int
) -> list[Call]:
    gate = asyncio.Semaphore(concurrency)

    async def one(number: int) -> Call:
        key = f"{row}.{number}"
        headers = {"Content-Type": "application/json"} if plan.method == "POST" else {}
        if plan.keyed:
            headers["Idempotency-Key"] = str(uuid.uuid4())
        body = BODY if plan.method == "POST" else None
        async with gate:
            started = time.perf_counter()
            try:
                async with session.request(
                    plan.method, f"{base}/search", params={"call": key}, data=body, headers=headers
                ) as response:
                    await response.read()
            except (aiohttp.ClientError, TimeoutError):
                return Call(key, (time.perf_counter() - started) * 1000, None, False)
            elapsed = (time.perf_counter() - started) * 1000
        return Call(key, elapsed, response.status, _copied(response.headers))

    return list(await asyncio.gather(*(one(number) for number in range(count))))


def _copied(headers: CIMultiDictProxy[str]) -> bool:
    """A ``hedge`` token in the sidecar's trail, or more than one attempt in Envoy's count."""
    trail = headers.get("X-Sidecar-Trail", "")
    attempts = headers.get("x-envoy-attempt-count", "1")
    return "hedge" in trail or (attempts.isdigit() and int(attempts) > 1)


def envoy_hedging(hedge_ms: int) -> envoy.RetryPolicy:
    """Envoy hedges when an attempt reaches its per-try timeout; the hedge policy acts only
    with a retry policy that names a retry condition and a number of retries. One retry:
    one more copy, as the sidecar sends. The copy waits out the retry back-off first, so
    it is set to Envoy's least, 1 ms: the copy goes out when the sidecar's would."""
    return envoy.RetryPolicy(
        retry_on="5xx",
        num_retries=1,
        per_try_timeout_s=hedge_ms / 1000,
        back_off_base_s=0.001,
        back_off_max_s=0.001,
    )


@contextlib.asynccontextmanager
async def target(bench: Bench, plan: Plan, tool_port: int) -> AsyncIterator[str]:
    if plan.target == "direct":
        yield f"http://127.0.0.1:{tool_port}"
        return
    if plan.target == "envoy":
        hedging = envoy_hedging(plan.hedge_ms)
        async with proxy(bench, "envoy", tool_port, envoy_policy=hedging, envoy_hedge=True) as url:
            yield url
        return
    settings = {HEDGE_SETTING: str(plan.hedge_ms)} if plan.hedge_ms else {}
    async with proxy(bench, "sidecar", tool_port, settings) as url:
        yield url


# --- the report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    plan: Plan
    calls: Sequence[Call]
    tool_calls: Sequence[int]  # per agent call, counted at the tool

    def percentile(self, fraction: float) -> float:
        return percentile([call.latency_ms for call in self.calls], fraction)

    @property
    def calls_per_call(self) -> float:
        return sum(self.tool_calls) / max(len(self.tool_calls), 1)

    @property
    def ratio(self) -> float:
        return self.percentile(0.99) / self.percentile(0.5)

    def meets_done_when(self) -> bool:
        return self.ratio <= P99_OVER_P50 and self.calls_per_call <= CALLS_PER_CALL

    def markdown(self) -> str:
        plan = self.plan
        statuses = (str(call.status or "no answer") for call in self.calls)
        not_ok = counted(status for status in statuses if status != "200")
        copied = sum(call.copied for call in self.calls) if plan.target != "direct" else "—"
        return (
            f"| {plan.through} | {plan.hedge_ms or '—'} | {plan.call} | "
            f"{format_ms(self.percentile(0.5))} | {format_ms(self.percentile(0.99))} | "
            f"{format_ms(self.percentile(1.0))} | {self.ratio:.2f} | "
            f"{self.calls_per_call:.2f} ({max(self.tool_calls, default=0)}) | {copied} | "
            f"{not_ok} |"
        )


HEADER = (
    "| through | hedge after ms | call | p50 ms | p99 ms | max ms | p99/p50 "
    "| tool calls per agent call (max) | copies the proxy reported | answers not 200 |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


async def measure(
    bench: Bench,
    tool: SlowSometimes,
    tool_port: int,
    plan: Plan,
    row: str,
    args: argparse.Namespace,
) -> Row:
    async with target(bench, plan, tool_port) as base, agent_session() as session:
        calls = await make_calls(session, base, plan, row, args.calls, args.concurrency)
    return Row(plan, calls, [tool.received[call.key] for call in calls])


def hedge_delays(anchor_ms: float, multiples: Sequence[float]) -> list[int]:
    return sorted({math.ceil(anchor_ms * multiple) for multiple in multiples})


async def run(args: argparse.Namespace, say: Callable[[str], None], workdir: Path) -> list[Row]:
    tool = SlowSometimes(args.fast_ms / 1000, args.slow_ms / 1000, args.slow_ratio, args.calls)
    runner = web.AppRunner(tool.app(), access_log=None, handle_signals=False)
    await runner.setup()
    tool_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", tool_port, backlog=1024).start()
    bench = Bench(workdir)
    rows: list[Row] = []

    async def add(plan: Plan) -> Row:
        rows.append(await measure(bench, tool, tool_port, plan, f"r{len(rows)}", args))
        print(rows[-1].markdown(), file=sys.stderr, flush=True)
        return rows[-1]

    try:
        await add(Plan("direct"))
        anchor = (await add(Plan("sidecar"))).percentile(0.5)
        delays = hedge_delays(anchor, args.multiples)
        say(
            f"Anchor: p50 through the sidecar with hedging off {anchor:.2f} ms; hedge delays "
            f"{', '.join(f'{ms} ms' for ms in delays)} ({', '.join(map(str, args.multiples))} "
            "× it, rounded up)."
        )
        for hedge_ms in delays:
            await add(Plan("sidecar", hedge_ms))
            await add(Plan("envoy", hedge_ms))
        for keyed in (False, True):
            for kind in ("sidecar", "envoy"):
                await add(Plan(kind, delays[0], "POST", keyed))
    finally:
        await asyncio.to_thread(bench.stop_all)
        await runner.cleanup()
    return rows


def report(rows: Sequence[Row], say: Callable[[str], None]) -> None:
    say(HEADER)
    for row in rows:
        say(row.markdown())
    say("")
    for row in rows:
        plan = row.plan
        if plan.hedge_ms and plan.method == "GET":
            verdict = "meets" if row.meets_done_when() else "does not meet"
            say(
                f"- {plan.through}, GET, hedge after {plan.hedge_ms} ms: p99/p50 {row.ratio:.2f} "
                f"at {row.calls_per_call:.2f} tool calls per agent call: {verdict} p99 ≤ "
                f"{P99_OVER_P50:g}× p50 at ≤ {CALLS_PER_CALL:.2f}."
            )
        elif plan.target == "sidecar" and plan.method == "POST" and not plan.keyed:
            hedged = "never hedged" if max(row.tool_calls, default=0) == 1 else "HEDGED"
            say(
                f"- sidecar, POST without Idempotency-Key, hedge after {plan.hedge_ms} ms: "
                f"{row.calls_per_call:.2f} tool calls per agent call (max "
                f"{max(row.tool_calls, default=0)}): {hedged}."
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="agent calls per row")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--fast-ms", type=float, default=5)
    parser.add_argument("--slow-ms", type=float, default=2000)
    parser.add_argument("--slow-ratio", type=float, default=0.05)
    parser.add_argument(
        "--multiples",
        type=lambda text: [float(part) for part in text.split(",")],
        default=[1.0, 1.5, 2.0],
        help="hedge delays, as multiples of the p50 through the sidecar with hedging off",
    )
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    say = Report()

    started = time.monotonic()
    load_before = os.getloadavg()
    say(f"# Hedged reads: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    say()
    known = "hedge_after_ms" in sidecar_settings({HEDGE_SETTING: "1"})
    draws = SlowSometimes(0, 0, args.slow_ratio, args.calls)
    slow = [n for n in range(args.calls) if draws.is_slow(str(n), 0)]
    slow_twice = [n for n in slow if draws.is_slow(str(n), 1)]
    say(
        f"The tool answers after {args.fast_ms:g} ms, or after {args.slow_ms:g} ms on "
        f"{args.slow_ratio:.0%} of the calls (a seeded sample: {len(slow)} of the "
        f"{args.calls}), and a copy is slow on a seeded draw at the same ratio "
        f"({len(slow_twice)} of the slow calls' copies). "
        f"{args.calls} calls per row, {args.concurrency} at a time, a fresh proxy per row. "
        f"Envoy {envoy.version()} (one worker): `hedge_policy: {{hedge_on_per_try_timeout: "
        f"true}}`, retry policy `{orjson.dumps(envoy_hedging(10).as_config()).decode()}` "
        "with the per-try timeout set to the row's hedge delay. The sidecar: shipped "
        f"defaults, {HEDGE_SETTING} set in the hedged rows"
        + ("." if known else ", which this sidecar does not know: it ignores it (hedging off).")
    )
    say(f"{platform.machine()}, {os.cpu_count()} cores, load average before {load_before[0]:.2f}.")
    with tempfile.TemporaryDirectory(prefix="sidecar-hedging-") as workdir:
        rows = asyncio.run(run(args, say, Path(workdir)))
    say()
    report(rows, say)
    say.finish(started, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
