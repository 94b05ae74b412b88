"""Real MCP clients' tasks under tool faults: task success by fault profile, client and lane.

    python bench/agents.py [--tasks 40] [--profiles NAME ...] [--clients NAME ...]
                           [--lanes NAME ...] [--seed 1] [--sidecar-src DIR]
                           [--bound-s 3600] [--out FILE]

The clients (bench/agent_clients.py), each at every default: the OpenAI Agents SDK
(``openai-agents``, ``MCPServerStreamableHttp``, its 5 s timeout included) and pydantic-ai
(``MCPToolset``), each driven by a scripted model, and the TypeScript SDK's ``Client`` over
``StreamableHTTPClientTransport`` (bench/ts_client.mjs). Each task is a fresh MCP session
making the same 1–3 tool calls (tests/agent_tasks.py draws them), so only the client and
the path vary. The tool is
the reference server ``@modelcontextprotocol/server-everything`` (npm, pinned), streamable
HTTP with its event store, installed with npm into bench/.cache/ on first use and held on
127.0.0.1 by a preload that binds its listener there. In front of it, a counting tap
(tests/mcp_tap.py) counts what it received and plays the tap's faults; Envoy's fault filter
plays the others, in an Envoy on the tool's side; ``session-lost`` is the tap's server
"restart", ``cut-after-event`` a call's event stream cut after its priming event, which
can be resumed with ``GET`` and ``Last-Event-ID`` (its docstring says how). The second
table is what the tool received (the stream resumptions among it, the client's and the
proxy's), the third the sidecar's own counts from its admin ``/metrics``. Lanes: no proxy;
Envoy with a standard retry policy;
``tool-retry-sidecar serve`` with its shipped defaults. A fresh server, tap, Envoys, sidecar
and node client per cell, so no cell inherits another's sessions or circuits. Tasks run one
at a time, each bounded by ``TASK_BOUND_S``. Every process is stopped by its PID;
``--bound-s`` ends the run, and the cells measured by then are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

# Run as `python bench/agents.py`, this file's folder leads sys.path, and this file would
# stand in for the Agents SDK's `agents` package: the repository root takes its place.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench import envoy  # noqa: E402
from bench.agent_clients import CLIENTS, Clients, versions  # noqa: E402
from bench.processes import (  # noqa: E402
    SIDECAR_ON_LOOPBACK,
    Bench,
    free_port,
    tree_serve,
    wait_for_port,
)
from bench.report import Report  # noqa: E402
from tests.agent_tasks import NOT_IDEMPOTENT, Outcome, Task, tasks  # noqa: E402
from tests.mcp_tap import Tally, Tap, seeded, tap_serving  # noqa: E402

EVERYTHING = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = "2026.8.31"
CACHE = Path(__file__).resolve().parent / ".cache" / f"server-everything-{EVERYTHING_VERSION}"
# server-everything listens on every interface (``app.listen(PORT)``); this preload binds
# any listener given only a port to 127.0.0.1 instead.
LOOPBACK_PRELOAD = """import net from "node:net";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || typeof args[0] === "string") {
    const rest = args.slice(1).filter((arg) => typeof arg === "function");
    return listen.call(this, Number(args[0]), "127.0.0.1", ...rest);
  }
  return listen.apply(this, args);
};
"""
# A task still running after this failed ("bench bound"): far above the Agents SDK's worst
# case (a few requests, 5 s each at most), at the TypeScript SDK's 60 s request timeout, and
# below pydantic-ai's (FastMCP's) 300 s read timeout.
TASK_BOUND_S = 60
FAULT_SHARE = 0.3


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    envoy_abort: int | None = None  # the tool-side Envoy's fault filter aborts with this
    tap_fault: str | None = None  # the tap's fault (tests/mcp_tap.py)
    share: float = FAULT_SHARE
    tool_side_envoy: bool = False  # an Envoy beside the tool even with no fault of its own


PROFILES = [
    Profile("none", "none"),
    Profile("503", "503", envoy_abort=503),
    Profile("429", "429 + `Retry-After: 1`", envoy_abort=429),
    Profile(
        "reset-before", "reset before the server saw it (10%)", tap_fault="reset-before", share=0.1
    ),
    Profile("reset-after", "reset after the server ran it", tap_fault="reset-after"),
    Profile(
        "reset-after-mesh",
        "reset after, behind a tool-side Envoy (its 503)",
        tap_fault="reset-after",
        tool_side_envoy=True,
    ),
    Profile(
        "rpc-error",
        "JSON-RPC `-32603` `retryable: true` in a 200 (streamed)",
        tap_fault="rpc-error",
    ),
    Profile(
        "rpc-error-json",
        "JSON-RPC `-32603` `retryable: true` in a 200 (JSON)",
        tap_fault="rpc-error-json",
    ),
    Profile(
        "cut-after-event",
        "stream cut after its priming event (resumable)",
        tap_fault="cut-after-event",
    ),
    Profile(
        "session-lost",
        "session lost: the server restarts (404 for its sessions)",
        tap_fault="session-lost",
    ),
]
LANES = ("none", "envoy", "sidecar")
# A standard retry policy for a tool, at Envoy's own back-off (25 ms base, 250 ms cap) and
# no per-try timeout: what a route with `retry_on: 5xx,reset,connect-failure` and 3 retries
# does without further tuning.
STANDARD_RETRIES = envoy.RetryPolicy(
    retry_on="5xx,reset,connect-failure",
    num_retries=3,
    per_try_timeout_s=None,
    back_off_base_s=0.025,
    back_off_max_s=0.25,
)


def fault_filter(status: int, share: float) -> dict[str, object]:
    """Envoy's fault filter: abort ``share`` of POSTs with ``status``, drawn per request."""
    return {
        "name": "envoy.filters.http.fault",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "abort": {
                "http_status": status,
                "percentage": {"numerator": round(share * 100), "denominator": "HUNDRED"},
            },
            "headers": [{"name": ":method", "string_match": {"exact": "POST"}}],
        },
    }


# Envoy's own 429s (the fault filter's) carry `Retry-After: 1`.
RETRY_AFTER_ON_429 = {
    "mappers": [
        {
            "filter": {
                "status_code_filter": {
                    "comparison": {
                        "op": "EQ",
                        "value": {"default_value": 429, "runtime_key": "bench.retry_after_429"},
                    }
                }
            },
            "headers_to_add": [
                {
                    "header": {"key": "Retry-After", "value": "1"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ],
        }
    ]
}


def everything_command() -> list[str]:
    """server-everything's streamable-HTTP transport, installed with npm on first use."""
    entry = CACHE / "node_modules" / EVERYTHING / "dist" / "index.js"
    if not entry.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(CACHE),
                "--no-audit",
                "--no-fund",
                "--silent",
                f"{EVERYTHING}@{EVERYTHING_VERSION}",
            ],
            check=True,
        )
    preload = CACHE / "loopback.mjs"
    preload.write_text(LOOPBACK_PRELOAD)
    return ["node", "--import", preload.as_uri(), str(entry), "streamableHttp"]


@dataclass
class Cell:
    profile: Profile
    client: str
    lane: str
    outcomes: list[Outcome] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    envoy_faults: int = 0
    exited: list[str] = field(default_factory=list)  # processes of the path that died mid-cell
    # The sidecar's own counts, read from its admin /metrics at the cell's end (sidecar lane).
    metrics: dict[str, float] = field(default_factory=dict)


class Run:
    """The processes of one cell, each started here and stopped by its PID."""

    def __init__(self, workdir: Path, sidecar_src: Path | None, record: bool = False) -> None:
        self.bench = Bench(workdir)
        self.workdir = workdir
        self.sidecar_src = sidecar_src
        self.record = record  # a recording relay in front of the lane (agent-requests.jsonl)
        self.sidecar_admin: int | None = None  # the sidecar's admin port, once started

    def everything(self) -> int:
        port = free_port()
        self.bench.start("everything", None, *everything_command(), env={"PORT": str(port)})
        wait_for_port(port)
        return port

    def envoy(
        self,
        name: str,
        upstream: int,
        policy: envoy.RetryPolicy | None,
        profile: Profile | None = None,
    ) -> tuple[int, int]:
        port, admin = free_port(), free_port()
        filters = (
            [fault_filter(profile.envoy_abort, profile.share)]
            if (profile and profile.envoy_abort)
            else []
        )
        config = envoy.config(
            port,
            admin,
            upstream,
            policy,
            filters=filters,
            local_reply=RETRY_AFTER_ON_429 if profile else None,
            attempt_count=policy is not None,
        )
        path = envoy.write_config(self.workdir / f"{name}.json", config)
        self.bench.start(name, None, *envoy.command(path))
        wait_for_port(port)
        return port, admin

    def sidecar(self, upstream: int) -> int:
        port, admin = free_port(), free_port()
        arguments = ["--upstream", f"http://127.0.0.1:{upstream}", "--port", str(port)]
        arguments += ["--admin-port", str(admin)]
        if self.sidecar_src is not None:
            command = tree_serve(self.sidecar_src.resolve(), *arguments)
        else:
            command = [str(Path(sys.executable).with_name("tool-retry-sidecar")), "serve"]
            command += arguments
        environment = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("SIDECAR_", "OPENAI_", "GOMIND_AGENT_"))
        }
        self.bench.start(
            "sidecar",
            None,
            *command,
            env={**environment, **SIDECAR_ON_LOOPBACK},
            inherit_env=False,
            keep_stdout=True,  # its log lines, in sidecar.out
        )
        wait_for_port(port, timeout_s=60)
        self.sidecar_admin = admin
        return port


@asynccontextmanager
async def cell_path(run: Run, cell: Cell, seed: int) -> AsyncIterator[tuple[str, int | None]]:
    """The path one cell's agent calls through: its MCP URL and the fault Envoy's admin."""
    profile = cell.profile
    tool = run.everything()
    tap = Tap(f"http://127.0.0.1:{tool}", tally=cell.tally)
    if profile.tap_fault:
        tap.fault, tap.decide = profile.tap_fault, seeded(profile.share, seed)
    async with AsyncExitStack() as stack:
        tapped = await stack.enter_async_context(tap_serving(tap))
        next_hop, fault_admin = int(tapped.rsplit(":", 1)[1]), None
        if profile.envoy_abort or profile.tool_side_envoy:
            next_hop, fault_admin = run.envoy("tool-side-envoy", next_hop, None, profile)
        if cell.lane == "envoy":
            next_hop, _ = run.envoy("lane-envoy", next_hop, STANDARD_RETRIES)
        elif cell.lane == "sidecar":
            next_hop = run.sidecar(next_hop)
        if run.record:
            log = run.workdir / "agent-requests.jsonl"
            recorder = Tap(
                f"http://127.0.0.1:{next_hop}", on_answer=recording(log), request_ids=True
            )
            recorded = await stack.enter_async_context(tap_serving(recorder))
            next_hop = int(recorded.rsplit(":", 1)[1])
        yield f"http://127.0.0.1:{next_hop}/mcp", fault_admin


def recording(log: Path) -> Callable[[web.Request, bytes, aiohttp.ClientResponse], None]:
    """What the agent sent and what its answer's head said, one JSON line a request, for a
    relay in front of the lane (``--record``): its JSON-RPC method and id, task, session,
    ``Last-Event-ID``, the answer's status and the sidecar's ``X-Sidecar-*`` headers. Each
    request gets an ``X-Request-ID`` (the sidecar logs it, and passes it on) unless it had one."""

    def record(request: web.Request, body: bytes, answer: aiohttp.ClientResponse) -> None:
        try:
            message = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            message = None
        rpc = message if isinstance(message, dict) else {}
        params = rpc.get("params")
        line = {
            "time": time.strftime("%H:%M:%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:],
            "method": request.method,
            "rpc": rpc.get("method"),
            "id": rpc.get("id"),
            "tool": params.get("name") if isinstance(params, dict) else None,
            "task": request.headers.get("x-bench-task"),
            "session": request.headers.get("mcp-session-id", "")[:8],
            "last_event_id": request.headers.get("last-event-id"),
            "request_id": answer.request_info.headers.get("x-request-id"),
            "status": answer.status,
            "content_type": answer.content_type,
            **{
                name.lower(): value
                for name, value in answer.headers.items()
                if name.lower().startswith("x-sidecar-") or name.lower() == "x-should-retry"
            },
        }
        with open(log, "ab") as lines:
            lines.write(orjson.dumps(line) + b"\n")

    return record


async def measure(cell: Cell, chosen: list[Task], seed: int, run: Run) -> None:
    client = Clients(cell.client, run.workdir)
    try:
        async with cell_path(run, cell, seed) as (url, fault_admin):
            for task in chosen:
                cell.outcomes.append(await client.run(url, task, TASK_BOUND_S))
            cell.exited = [
                f"{running.name} exited ({running.process.returncode}) during the cell"
                for running in run.bench.running
                if running.process.poll() is not None
            ]
            if fault_admin is not None:
                cell.envoy_faults = await aborts_injected(fault_admin)
            if run.sidecar_admin is not None:
                cell.metrics = await sidecar_counts(run.sidecar_admin)
    finally:
        await client.close()
        run.bench.stop_all()


async def aborts_injected(admin: int) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{admin}/stats?filter=fault.aborts_injected") as answer,
    ):
        text = await answer.text()
    return sum(int(line.rsplit(":", 1)[1]) for line in text.splitlines() if ":" in line)


# The sidecar's samples summed by these labels (the rest summed over), for the third table.
SIDECAR_COUNTS = {
    "sidecar_mcp_sessions_reopened_total": "result",
    "sidecar_requests_total": "outcome",
    "sidecar_retries_total": "reason",
}


async def sidecar_counts(admin: int) -> dict[str, float]:
    """The sidecar's counts of ``SIDECAR_COUNTS`` from its admin ``/metrics``, keyed
    ``name{label}``; empty when it does not answer (a sidecar that died mid-cell)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(f"http://127.0.0.1:{admin}/metrics") as answer,
        ):
            text = await answer.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"(\w+)\{(.*)\} (\S+)$", line)
        if match is None or match[1] not in SIDECAR_COUNTS:
            continue
        label = re.search(rf'{SIDECAR_COUNTS[match[1]]}="([^"]*)"', match[2])
        key = f"{match[1]}{{{label[1] if label else ''}}}"
        counts[key] = counts.get(key, 0.0) + float(match[3])
    return counts


def p95(seconds: list[float]) -> str:
    if not seconds:
        return "—"
    ordered = sorted(seconds)
    return f"{ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]:.2f}"


def figures(cell: Cell, half: str | None) -> tuple[str, str, str]:
    """Success %, p95 task seconds, and calls run twice (of them not idempotent)."""
    chosen = [o for o in cell.outcomes if half is None or o.task.half == half]
    numbers = {str(o.task.number) for o in chosen}
    success = 100 * sum(o.succeeded for o in chosen) / len(chosen) if chosen else 0.0
    twice = [d for d in cell.tally.calls_run_twice() if d.task in numbers]
    risky = sum(d.tool in NOT_IDEMPOTENT for d in twice)
    return f"{success:.1f}", p95([o.seconds for o in chosen]), f"{len(twice)} ({risky})"


def row(cell: Cell) -> str:
    even, odd, whole = (figures(cell, half) for half in ("even", "odd", None))
    faults = str(cell.envoy_faults + sum(cell.tally.faults.values()))
    if cell.tally.not_found:
        faults += f" ({cell.tally.not_found} 404s)"
    reasons = Counter(reason(o.error) for o in cell.outcomes if not o.succeeded)
    failed = ", ".join(
        [*cell.exited, *(f"{reason} ×{count}" for reason, count in reasons.most_common(3))]
    )
    cells = [
        cell.profile.title,
        cell.client,
        cell.lane,
        *(f[0] for f in (even, odd, whole)),
        *(f[1] for f in (even, odd, whole)),
        *(f[2] for f in (even, odd, whole)),
        faults,
        failed or "—",
    ]
    return "| " + " | ".join(cells) + " |"


def reason(error: str) -> str:
    """A failed task's error, short enough for a table cell and alike across sessions."""
    if error.startswith("tool answered") and "Stopped" in error:
        return "a toggle run twice (answered Stopped)"
    if error.startswith("tool answered") and "An error occurred" in error:
        return "a tool call failed (SDK: an error occurred)"
    if error.startswith("tool answered") and "error: " in error:
        # The ts-sdk and pydantic-ai runners give a failed call's error as its answer.
        error = (
            "a tool call failed: " + re.split(r"""['"](, |\])""", error.split("error: ", 1)[1])[0]
        )
    # A JSON-RPC error body quoted in the message: its message is enough.
    error = re.sub(r'\{"jsonrpc":"2\.0".*?"message":"([^"]*)".*', r'JSON-RPC "\1"', error)
    error = error.replace(" to MCP server 'everything'", "").replace("|", "/")
    error = error.replace("Streamable HTTP error: Error POSTing to endpoint: ", "POST: ")
    error = re.sub(r"[0-9a-f]{8}-?[0-9a-f-]{24,27}", "…", error)
    return re.sub(r"\s+", " ", error)[:80]


def requests_row(cell: Cell) -> str:
    """What reached the tool beside the table's figures: sessions opened, tool calls, GETs
    (resumed streams among them), DELETEs, and the tap's 404s for forgotten sessions."""
    methods, others = cell.tally.by_method(), cell.tally.others
    calls = sum(count for method, count in methods.items() if method.startswith("tools/call"))
    cells = [
        cell.profile.title,
        cell.client,
        cell.lane,
        str(methods["initialize"]),
        str(calls),
        str(others["GET"] + others["GET Last-Event-ID"]),
        str(others["GET Last-Event-ID"]),
        str(cell.tally.resumed["client"]),
        str(cell.tally.resumed["proxy"]),
        str(others["DELETE"]),
        str(cell.tally.not_found),
    ]
    return "| " + " | ".join(cells) + " |"


def sidecar_row(cell: Cell) -> str:
    """The sidecar's own counts for a cell: sessions it opened again, its requests by
    outcome and its retries by reason."""

    def listed(name: str) -> str:
        found = [
            (key[len(name) + 1 : -1], count)
            for key, count in sorted(cell.metrics.items())
            if key.startswith(name + "{") and count
        ]
        return ", ".join(f"{label} {count:.0f}" for label, count in found) or "0"

    cells = [
        cell.profile.title,
        cell.client,
        *(listed(name) for name in SIDECAR_COUNTS),
    ]
    return "| " + " | ".join(cells) + " |"


REQUESTS_HEADER = [
    "| fault | client | lane | initialize delivered | tools/call delivered | GET "
    "| of them with Last-Event-ID | resumptions relayed: client's | proxy's "
    "| DELETE | 404s for a forgotten session |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
SIDECAR_HEADER = [
    "| fault | client | sessions opened again (`sidecar_mcp_sessions_reopened_total`) "
    "| requests by outcome (`sidecar_requests_total`) | retries by reason "
    "(`sidecar_retries_total`) |",
    "|---|---|---|---|---|",
]
HEADER = [
    "| fault | client | lane | success % even | odd | all | p95 s even | odd | all "
    "| run twice (not idempotent) even | odd | all | faults played | how tasks failed |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


async def main_async(args: argparse.Namespace) -> None:
    chosen_tasks = tasks(args.tasks, args.seed)
    profiles = [p for p in PROFILES if not args.profiles or p.name in args.profiles]
    clients = [client for client in CLIENTS if not args.clients or client in args.clients]
    report, started = Report(), time.monotonic()
    report(
        f"{versions(clients)}; mcp {metadata.version('mcp')}, "
        f"{EVERYTHING}@{EVERYTHING_VERSION}, Envoy {envoy.version()}; "
        f"{len(chosen_tasks)} tasks per cell, seed {args.seed}, "
        f"sidecar from {args.sidecar_src or 'this checkout'}"
    )
    report()
    for line in HEADER:
        report(line)
    workdir = Path(tempfile.mkdtemp(prefix="agents-bench-"))
    measured: list[Cell] = []
    try:
        async with asyncio.timeout(args.bound_s):
            for profile in profiles:
                for client in clients:
                    for lane in [lane for lane in LANES if not args.lanes or lane in args.lanes]:
                        cell = Cell(profile, client, lane)
                        # Each cell's processes write their stderr in a folder of its own.
                        folder = workdir / f"{len(measured):02d}-{profile.name}-{client}-{lane}"
                        folder.mkdir()
                        run = Run(folder, args.sidecar_src, args.record)
                        await measure(cell, chosen_tasks, args.seed, run)
                        measured.append(cell)
                        report(row(cell))
    except TimeoutError:
        report(f"(stopped at the {args.bound_s} s bound; the rows above are whole cells)")
    report()
    report("What the tool received besides (counted by the tap, every lane's retries included):")
    report()
    for line in REQUESTS_HEADER:
        report(line)
    for cell in measured:
        report(requests_row(cell))
    report()
    sidecar_cells = [cell for cell in measured if cell.lane == "sidecar"]
    if sidecar_cells:
        report("The sidecar's own counts (its admin /metrics at each sidecar cell's end):")
        report()
        for line in SIDECAR_HEADER:
            report(line)
        for cell in sidecar_cells:
            report(sidecar_row(cell))
        report()
    report(
        f"Each cell's processes' stderr, and the sidecar's log lines (sidecar.out): "
        f"{workdir}/NN-profile-client-lane/."
    )
    report.finish(started, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40, help="tasks per cell")
    parser.add_argument("--profiles", nargs="*", choices=[p.name for p in PROFILES])
    parser.add_argument("--clients", nargs="*", choices=CLIENTS)
    parser.add_argument("--lanes", nargs="*", choices=LANES)
    parser.add_argument("--seed", type=int, default=1, help="tasks and the tap's fault draws")
    parser.add_argument("--sidecar-src", type=Path, help="run the sidecar from this tree")
    parser.add_argument("--bound-s", type=float, default=3600, help="end the run after this")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument(
        "--record",
        action="store_true",
        help="a relay in front of each lane writes what the agent sent and got "
        "(agent-requests.jsonl in the cell's folder)",
    )
    # The SDKs log every request and every failed tool call; the table says what matters.
    logging.disable(logging.CRITICAL)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
