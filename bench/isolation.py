"""One agent or one tool misbehaving, the others' probes still answered: each attack run
against a real ``serve`` of a sidecar tree, a healthy probe to another route every 250 ms.

    python bench/isolation.py --before /tmp/before      # the "after" is this tree

For each tree and attack, a fresh sidecar process; it reports the probes answered 200
within 1 s (and the worst), the sidecar's peak RSS over its RSS before the attack
(``VmHWM`` against ``VmRSS``), and the CPU seconds it spent during the attack:

- ``head-1-byte``: a tool writes a 58 KB answer head one byte at a time (1 call);
- ``small-heads-1-byte``: the same bytes in 72-byte answer heads (778 calls), the
  anchor ``head-1-byte`` compares with;
- ``trickle``: 2,100 agents each send a head and then one body byte a second;
- ``heads``: 1,000 agents each send 120 KB of an unfinished head;
- ``bodies``: 100 agents each post a 5 MiB body at once.

Everything listens on 127.0.0.1, each attack ends by itself within ``ATTACK_S`` (plus its
set-up), and every process started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, wait_for_port
from report import Report

HERE = Path(__file__).resolve().parent
ATTACK_S = 12.0
PROBE_EVERY_S = 0.25
PROBE_DEADLINE_S = 1.0
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


async def probes(port: int, stop: asyncio.Event) -> list[float | str]:
    """A GET to the probe route every 250 ms until ``stop``: each one's latency, or what it
    got instead of a 200 within 1 s."""
    latencies: list[float | str] = []
    timeout = aiohttp.ClientTimeout(total=PROBE_DEADLINE_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> None:
            started = time.monotonic()
            try:
                async with session.get(f"http://127.0.0.1:{port}/probe/now") as answer:
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


ATTACKS: dict[str, Callable[[int, int], Awaitable[None]]] = {
    "head-1-byte": head_1_byte,
    "small-heads-1-byte": small_heads_1_byte,
    "trickle": trickle,
    "heads": heads,
    "bodies": bodies,
}


def sidecar_command(tree: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(tree)!r}); import sidecar, runpy;"
        f"assert sidecar.__file__.startswith({str(tree)!r}), sidecar.__file__;"
        "runpy.run_module('sidecar', run_name='__main__')",
        "serve",
        "--port",
        str(port),
        "--admin-port",
        str(free_port()),
    ]


async def attack_once(pid: int, port: int, attack: str) -> dict[str, object]:
    rss_before, cpu_before = proc_status(pid, "VmRSS"), cpu_s(pid)
    stop = asyncio.Event()
    probing = asyncio.create_task(probes(port, stop))
    started = time.monotonic()
    await ATTACKS[attack](port, pid)
    elapsed_s = time.monotonic() - started
    stop.set()
    latencies = await probing
    answered = [latency for latency in latencies if isinstance(latency, float)]
    failed = sorted({str(got) for got in latencies if isinstance(got, str)})
    return {
        "probes": len(latencies),
        "answered_1s": len(answered),
        "worst_ms": round(max(answered, default=0) * 1000),
        "peak_rss_over_mib": round((proc_status(pid, "VmHWM") - rss_before) / 2**20, 1),
        "cpu_s": round(cpu_s(pid) - cpu_before, 2),
        "attack_s": round(elapsed_s, 1),
        "failed": ", ".join(failed) or "—",
    }


def run_tree(bench: Bench, tree: Path, attack: str, tools: dict[str, int]) -> dict[str, object]:
    port = free_port()
    routes = [
        {"name": "probe", "prefix": "/probe", "upstream": f"http://127.0.0.1:{tools['ok']}"},
        {"name": "upload", "prefix": "/upload", "upstream": f"http://127.0.0.1:{tools['ok']}"},
        {"name": "slowhead", "prefix": "/slowhead", "upstream": f"http://127.0.0.1:{tools['raw']}"},
    ]
    env = {
        **SIDECAR_ON_LOOPBACK,
        "SIDECAR_ROUTES": json.dumps(routes),
        "SIDECAR_LOG_LEVEL": "error",
    }
    sidecar = bench.start(f"sidecar-{attack}", None, *sidecar_command(tree, port), env=env)
    try:
        wait_for_port(port)
        time.sleep(1)  # the heap settles after start-up
        return asyncio.run(attack_once(sidecar.process.pid, port, attack))
    finally:
        bench.stop(sidecar)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout of the project")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--slow-head-tool", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.slow_head_tool:
        asyncio.run(slow_head_tool(args.slow_head_tool))
        return
    # 2,100 agents' sockets and the sidecar's answers to them, both sides on this machine.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    trees = {"after": HERE.parent} | ({"before": args.before} if args.before else {})
    report = Report()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        bench = Bench(Path(workdir))
        tools = {"ok": free_port(), "raw": free_port()}
        try:
            bench.start(
                "ok-tool", None, sys.executable, str(HERE / "upstream.py"), str(tools["ok"])
            )
            bench.start(
                "raw-tool", None, sys.executable, __file__, "--slow-head-tool", str(tools["raw"])
            )
            for port in tools.values():
                wait_for_port(port)
            report("| attack | tree | probes | ≤1 s | worst ms | RSS +MiB | CPU s | s | failed |")
            report("|---|---|---|---|---|---|---|---|---|")
            for attack in args.attacks.split(","):
                for name, tree in sorted(trees.items(), reverse=True):
                    got = run_tree(bench, tree, attack, tools)
                    report(
                        f"| {attack} | {name} | {got['probes']} | {got['answered_1s']} | "
                        f"{got['worst_ms']} | {got['peak_rss_over_mib']} | {got['cpu_s']} | "
                        f"{got['attack_s']} | {got['failed']} |"
                    )
        finally:
            bench.stop_all()
    report.finish(started, None)


if __name__ == "__main__":
    main()
