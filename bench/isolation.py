"""One agent or one tool misbehaving, the others' probes still answered: each attack run
against a real ``serve`` of a sidecar tree, a healthy probe to another route every 250 ms.

    python bench/isolation.py --before /tmp/before      # the "after" is this tree

For each tree and attack, a fresh sidecar process; it reports the probes answered 200
within 1 s (and the worst), the sidecar's peak RSS over its RSS before the attack
(``VmHWM`` against ``VmRSS``), and the CPU seconds it spent during the attack and the
``AFTER_S`` after it (``s`` is the attack's own time: for one call, until it was answered):

- ``head-1-byte``: a tool writes a 58 KB answer head one byte at a time (1 call);
- ``small-heads-1-byte``: the same bytes in 72-byte answer heads (778 calls), the
  anchor ``head-1-byte`` compares with;
- ``trickle``: 2,100 agents each send a head and then one body byte a second;
- ``heads``: 1,000 agents each send 120 KB of an unfinished head;
- ``bodies``: 100 agents each post a 5 MiB body at once;
- ``llm-gzip-200`` … ``llm-plain-500``: one agent's call fails with a ``422`` the LLM repairs,
  and the model's endpoint answers a 1 GiB-inflating gzip, a 4 GiB-inflating brotli or a
  300 MiB plain JSON answer, on a 200 and on a 500 (``SIDECAR_LLM_TIMEOUT_MS`` as by
  default, 10 s: the call must end within 15 s). The bombs are tests/test_llm_bounds.py's,
  made once (the brotli one is kept in ``bench/.cache``); the plain answer is streamed;
- ``prompt-16000-fields``: a 16,000-field (1 MB) payload, half of its fields secret-named,
  answered ``422``; ``prompt-7000-details``: a ``422`` with 7,000 ``details``.

A second probe asks the admin port's ``/healthz`` every 250 ms. The attack runs in a process
of its own: sharing the probes' event loop, sending 500 MB held that loop, and the probes
timed the bench's stall as the sidecar's. Every probe waits as long as
it takes, so the worst latency is how long a stall held it; ``≤1 s`` counts those answered
200 within 1 s. The sidecar is killed (by its PID) past ``--rss-limit-mib``, so that a bomb
cannot take a shared machine's memory; its row then says so.

Everything listens on 127.0.0.1, each attack ends by itself within ``ATTACK_S`` (plus its
set-up), and every process started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import resource
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import aiohttp
from aiohttp import web
from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, tree_serve, wait_for_port
from report import Report

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent))  # tests/ holds the bombs and the model's answers

from tests.conftest import completion  # noqa: E402
from tests.test_llm_bounds import brotli_bomb, gzip_bomb  # noqa: E402
from tests.test_repair import fix  # noqa: E402

ATTACK_S = 12.0
PROBE_EVERY_S = 0.25
PROBE_DEADLINE_S = 1.0
# A probe waits this long at most: how long a stall held it, not only that it did.
PROBE_WAIT_S = 60.0
# The LLM timeout (10 s by default) plus 5 s, as the bound, and room to see a tree miss it.
REPAIR_WAIT_S = 90.0
# Probes (and the CPU count) go on this long after the attack: work it left running counts.
AFTER_S = 2.0
MiB = 1024 * 1024
BYTE_PACE_S = 0.00005
# A head inside the default 64 KiB limit, in 1,000 lines.
BIG_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-Field-%04d: %s\r\n" % (n, b"v" * 40) for n in range(1000))
    + b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
)
SMALL_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def slow_head_tool(port: int) -> None:
    """A tool that answers every request with ``BIG_HEAD`` (``SMALL_HEAD`` for a path ending
    in ``/small``), one byte per write."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                head = SMALL_HEAD if b"/small " in request.split(b"\r\n", 1)[0] else BIG_HEAD
                for at in range(len(head)):
                    writer.write(head[at : at + 1])
                    await writer.drain()
                    # Paced (a spin: a timer is a millisecond at best), so that each byte
                    # can be a read of its own on the sidecar's side; unpaced, the kernel
                    # hands it hundreds at once. A sidecar that falls behind reads more
                    # at once: the cost is the cost of the same bytes on the same wire.
                    paced_until = time.perf_counter() + BYTE_PACE_S
                    while time.perf_counter() < paced_until:
                        pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def proc_status(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


async def probes(url: str, stop: asyncio.Event) -> list[float | str]:
    """A GET to ``url`` every 250 ms until ``stop``: each one's latency, or what it got
    instead of a 200 within ``PROBE_WAIT_S``."""
    latencies: list[float | str] = []
    timeout = aiohttp.ClientTimeout(total=PROBE_WAIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> None:
            started = time.monotonic()
            try:
                async with session.get(url) as answer:
                    await answer.read()
                    got: float | str = str(answer.status)
            except TimeoutError:
                got = "timeout"
            except aiohttp.ClientError as exc:
                got = type(exc).__name__
            latencies.append(time.monotonic() - started if got == "200" else got)

        sent = []
        while not stop.is_set():
            sent.append(asyncio.create_task(one()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PROBE_EVERY_S)
        await asyncio.gather(*sent)
    return latencies


async def hold_connections(port: int, count: int, first: bytes, drip: bytes | None) -> None:
    """``count`` connections sending ``first``, then ``drip`` once a second, for ATTACK_S."""
    writers = []
    try:
        for _ in range(count):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                break
            writer.write(first)
            writers.append(writer)
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            await asyncio.sleep(1)
            for writer in writers:
                if drip and not writer.is_closing():
                    writer.write(drip)
    finally:
        for writer in writers:
            writer.close()


async def trickle(port: int, _: int) -> None:
    head = b"POST /upload/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    await hold_connections(port, 2100, head, b"{")


async def heads(port: int, _: int) -> None:
    line = b"X-Pad: " + b"a" * 30_000 + b"\r\n"
    await hold_connections(port, 1000, b"GET /upload/x HTTP/1.1\r\nHost: x\r\n" + line * 4, None)


async def bodies(port: int, _: int) -> None:
    body = b"{" * (5 * 1024 * 1024)
    timeout = aiohttp.ClientTimeout(total=ATTACK_S * 3)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def post() -> None:
            try:
                async with session.post(f"http://127.0.0.1:{port}/upload/x", data=body) as answer:
                    await answer.read()
            except (TimeoutError, aiohttp.ClientError):
                pass

        await asyncio.gather(*(post() for _ in range(100)))


async def head_1_byte(port: int, _: int) -> None:
    """One call whose answer head comes a byte at a time (raw: 1,000 headers are more than
    aiohttp's client takes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /slowhead/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await asyncio.wait_for(reader.read(), ATTACK_S * 10)
    writer.close()


async def small_heads_1_byte(port: int, _: int) -> None:
    """As many bytes as ``head-1-byte`` in small answer heads, one call after another on
    one connection: the cost of the same reads when no head is large."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(len(BIG_HEAD) // len(SMALL_HEAD)):
        writer.write(b"GET /slowhead/small HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ATTACK_S)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    writer.close()


def cached_bomb(name: str, make: Callable[[], bytes]) -> bytes:
    """A bomb made once per checkout: the brotli one compresses 4 GiB, some seconds."""
    path = HERE / ".cache" / f"isolation-{name}.bin"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(make())
    return path.read_bytes()


# A chat completion, then JSON whitespace: the same answer, 300 MiB long.
PLAIN_ANSWER = completion(json.dumps(fix({"location": "Flower Mound, TX, USA"}))).body
PLAIN_PADDING_MIB = 300
DETAILS = {f"f{index}": f"bad {index}" for index in range(7000)}


def model_and_tool() -> web.Application:
    """The tool (``422`` for every call) and the model's endpoint (its answer by the case the
    base URL names: ``/<case>/v1/chat/completions``) the LLM attacks need."""
    bombs = {"gzip": gzip_bomb(), "br": cached_bomb("br", brotli_bomb)}

    async def tool(request: web.Request) -> web.Response:
        await request.read()
        named = {"field": "note_1"} if request.path.endswith("-fields") else {"field": "location"}
        details = DETAILS if request.path.endswith("-details") else named
        error = {"code": "BAD", "message": "a field is wrong", "category": "INPUT_ERROR"}
        envelope = {"success": False, "error": {**error, "retryable": True, "details": details}}
        return web.json_response(envelope, status=422)

    async def model(request: web.Request) -> web.StreamResponse:
        await request.read()
        kind, _, status = request.match_info["case"].partition("-")
        if kind in bombs:
            headers = {"Content-Encoding": kind, "Content-Type": "application/json"}
            return web.Response(body=bombs[kind], status=int(status), headers=headers)
        if kind != "plain":  # a prompt attack: a quick answer, the cost is before it
            return completion(json.dumps(fix({}, can_fix=False)))
        assert isinstance(PLAIN_ANSWER, bytes)
        answer = web.StreamResponse(status=int(status))
        answer.content_type = "application/json"
        answer.content_length = len(PLAIN_ANSWER) + PLAIN_PADDING_MIB * MiB
        await answer.prepare(request)
        await answer.write(PLAIN_ANSWER)
        for _ in range(PLAIN_PADDING_MIB):
            await answer.write(b" " * MiB)
        return answer

    app = web.Application(client_max_size=64 * MiB)
    app.router.add_post("/{case}/v1/chat/completions", model)
    app.router.add_post("/{tail:.*}", tool)
    return app


async def repair_call(case: str, port: int, _: int) -> str:
    """One agent's call the tool answers ``422`` and the LLM is asked to repair."""
    if case == "16000-fields":  # 1 MB, half of the fields secret-named
        payload = {
            f"{kind}_{n}": f"{kind}-{n:08d}-" + "v" * 30
            for n in range(8000)
            for kind in ("password", "note")
        }
    else:
        payload = {"location": "Flower Mound, TX"}
    timeout = aiohttp.ClientTimeout(total=REPAIR_WAIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            async with session.post(f"http://127.0.0.1:{port}/repair/{case}", json=payload) as got:
                await got.read()
                return got.headers.get("X-Sidecar-Trail") or str(got.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return type(exc).__name__


LLM_CASES = [f"{kind}-{status}" for kind in ("gzip", "br", "plain") for status in (200, 500)]
PROMPT_CASES = ["16000-fields", "7000-details"]

ATTACKS: dict[str, Callable[[int, int], Awaitable[str | None]]] = {
    "head-1-byte": head_1_byte,
    "small-heads-1-byte": small_heads_1_byte,
    "trickle": trickle,
    "heads": heads,
    "bodies": bodies,
    **{f"llm-{case}": functools.partial(repair_call, case) for case in LLM_CASES},
    **{f"prompt-{case}": functools.partial(repair_call, case) for case in PROMPT_CASES},
}


def run_attack(attack: str, port: int, pid: int) -> str | None:
    """One attack, in the process it runs in, to its end."""
    return asyncio.run(ATTACKS[attack](port, pid))


def sidecar_command(tree: Path, port: int, admin_port: int) -> list[str]:
    return tree_serve(tree, "--port", str(port), "--admin-port", str(admin_port))


async def rss_watch(pid: int, limit: int, killed: list[int]) -> None:
    """Kill ``pid`` (a sidecar this bench started) once its RSS passes ``limit``; what it
    had reached goes in ``killed``."""
    while True:
        try:
            rss = proc_status(pid, "VmRSS")
        except (OSError, KeyError):  # it ended by itself
            return
        if rss > limit:
            os.kill(pid, signal.SIGKILL)
            killed.append(rss)
            return
        await asyncio.sleep(0.05)


def probed(latencies: list[float | str]) -> tuple[int, int, str]:
    """(probes answered 200 within 1 s, the worst 200's latency in ms, what the rest got)."""
    answered = [latency for latency in latencies if isinstance(latency, float)]
    within = sum(latency <= PROBE_DEADLINE_S for latency in answered)
    failed = sorted({str(got) for got in latencies if isinstance(got, str)})
    return within, round(max(answered, default=0) * 1000), ", ".join(failed) or "—"


async def attack_once(
    pid: int, ports: tuple[int, int], attack: str, rss_limit: int
) -> dict[str, object]:
    port, admin_port = ports
    rss_before, cpu_before = proc_status(pid, "VmRSS"), cpu_s(pid)
    stop = asyncio.Event()
    probing = asyncio.create_task(probes(f"http://127.0.0.1:{port}/probe/now", stop))
    health = asyncio.create_task(probes(f"http://127.0.0.1:{admin_port}/healthz", stop))
    killed: list[int] = []
    watching = asyncio.create_task(rss_watch(pid, rss_limit, killed))
    started = time.monotonic()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as attacker:
        outcome = await asyncio.get_running_loop().run_in_executor(
            attacker, run_attack, attack, port, pid
        )
    elapsed_s = time.monotonic() - started
    await asyncio.sleep(AFTER_S)
    stop.set()
    proxied, healthz = await probing, await health
    within, worst_ms, failed = probed(proxied)
    health_within, health_worst_ms, _ = probed(healthz)
    watching.cancel()
    peak = killed[0] if killed else proc_status(pid, "VmHWM")
    return {
        "probes": f"{within}/{len(proxied)}",
        "worst_ms": worst_ms,
        "healthz": f"{health_within}/{len(healthz)}",
        "healthz_worst_ms": health_worst_ms,
        "peak_rss_over_mib": ("> " if killed else "") + f"{(peak - rss_before) / MiB:.1f}",
        "cpu_s": round(cpu_s(pid) - cpu_before, 2),
        "attack_s": round(elapsed_s, 1),
        "outcome": (f"killed at {killed[0] // MiB} MiB; " if killed else "") + (outcome or "—"),
        "failed": failed,
    }


def run_tree(
    bench: Bench, tree: Path, attack: str, tools: dict[str, int], rss_limit: int
) -> dict[str, object]:
    port, admin_port = free_port(), free_port()
    routes = [
        {"name": "probe", "prefix": "/probe", "upstream": f"http://127.0.0.1:{tools['ok']}"},
        {"name": "upload", "prefix": "/upload", "upstream": f"http://127.0.0.1:{tools['ok']}"},
        {"name": "slowhead", "prefix": "/slowhead", "upstream": f"http://127.0.0.1:{tools['raw']}"},
        {"name": "repair", "prefix": "/repair", "upstream": f"http://127.0.0.1:{tools['model']}"},
    ]
    case = attack.partition("-")[2]
    env = {
        **SIDECAR_ON_LOOPBACK,
        "SIDECAR_ROUTES": json.dumps(routes),
        "SIDECAR_LOG_LEVEL": "error",
        "SIDECAR_REPAIR": "auto",
        "SIDECAR_LLM_BASE_URL": f"http://127.0.0.1:{tools['model']}/{case}/v1",
    }
    command = sidecar_command(tree, port, admin_port)
    sidecar = bench.start(f"sidecar-{attack}", None, *command, env=env)
    try:
        wait_for_port(port)
        time.sleep(1)  # the heap settles after start-up
        return asyncio.run(attack_once(sidecar.process.pid, (port, admin_port), attack, rss_limit))
    finally:
        bench.stop(sidecar)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout of the project")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--rss-limit-mib", type=int, default=3072)
    parser.add_argument("--slow-head-tool", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-and-tool", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.slow_head_tool:
        asyncio.run(slow_head_tool(args.slow_head_tool))
        return
    if args.model_and_tool:
        web.run_app(model_and_tool(), host="127.0.0.1", port=args.model_and_tool, print=None)
        return
    # 2,100 agents' sockets and the sidecar's answers to them, both sides on this machine.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    trees = {"after": HERE.parent} | ({"before": args.before} if args.before else {})
    report = Report()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        bench = Bench(Path(workdir))
        tools = {"ok": free_port(), "raw": free_port(), "model": free_port()}
        try:
            bench.start(
                "ok-tool", None, sys.executable, str(HERE / "upstream.py"), str(tools["ok"])
            )
            bench.start(
                "raw-tool", None, sys.executable, __file__, "--slow-head-tool", str(tools["raw"])
            )
            bench.start(
                "model", None, sys.executable, __file__, "--model-and-tool", str(tools["model"])
            )
            for port in tools.values():
                wait_for_port(port, 120)  # the bombs are made first
            report(
                "| attack | tree | probes ≤1 s | worst ms | /healthz ≤1 s | worst ms "
                "| RSS +MiB | CPU s | s | attacked call | probes failed |"
            )
            report("|---|---|---|---|---|---|---|---|---|---|---|")
            for attack in args.attacks.split(","):
                for name, tree in sorted(trees.items(), reverse=True):
                    got = run_tree(bench, tree, attack, tools, args.rss_limit_mib * MiB)
                    report(
                        f"| {attack} | {name} | {got['probes']} | {got['worst_ms']} | "
                        f"{got['healthz']} | {got['healthz_worst_ms']} | "
                        f"{got['peak_rss_over_mib']} | {got['cpu_s']} | {got['attack_s']} | "
                        f"{got['outcome']} | {got['failed']} |"
                    )
        finally:
            bench.stop_all()
    report.finish(started, None)


if __name__ == "__main__":
    main()
