"""Where the sidecar's time goes under load: py-spy's samples, self time by owner.

The sidecar (this tree, or ``--tree``) is pinned to core 0 in front of an nginx upstream on
core 1, as in ``run.py``; wrk POSTs at c=64 while ``py-spy record -r 200`` samples it.
py-spy (``pip install py-spy``) must be allowed to read the process (ptrace).

    python bench/profile_sidecar.py --seconds 8 [--tree /tmp/before]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from processes import SIDECAR_ON_LOOPBACK, Bench, free_port, wait_for_port
from run import HERE, LOAD_CORE, OK_JSON, PROXY_CORE, PYTHON, nginx_config, wrk

UPSTREAM_CLIENT = "the upstream client (sidecar/transport/; in 0.3 sidecar/http1.py)"
AIOHTTP_CLIENT = (
    "aiohttp/client",
    "aiohttp/connector",
    "aiohttp/payload",
    "aiohttp/tracing",
    "aiohttp/cookiejar",
)
# The agent-facing server: aiohttp's (0.3) or the sidecar's own protocol (0.4).
AGENT_SERVER = (
    "aiohttp/web",
    "sidecar/serve/httpserver.py",
    "sidecar/serve/agentwire.py",
    "httptools/",
)
# Frames that serve whoever calls them (aiohttp's writer and streams serve both sides,
# asyncio's timeouts and tasks whoever arms them): their time goes to the nearest caller
# with an owner. What is left to asyncio is the event loop itself.
SHARED = (
    "(aiohttp/",
    "(multidict/",
    "(yarl/",
    "(asyncio/",
    "<frozen",
    "<string>",
    "contextlib",
    "enum",
)


def client_frame(frame: str) -> bool:
    """A frame of the upstream client: this tree's, or aiohttp's and the wrappers
    (``_Staged*``) the sidecar had around it."""
    return (
        "sidecar/transport/" in frame
        or "sidecar/http1.py" in frame
        or "_Staged" in frame
        or any(part in frame for part in AIOHTTP_CLIENT)
    )


def owner_of(stack: list[str]) -> str:
    """The owner of a sample: its innermost frame that is not a shared utility."""
    for frame in reversed(stack):
        if client_frame(frame):
            return UPSTREAM_CLIENT
        if any(part in frame for part in AGENT_SERVER):
            return "the agent-facing server (aiohttp's in 0.3, serve/httpserver since 0.4)"
        if "(sidecar/telemetry/" in frame:
            return "the sidecar's telemetry hooks (metrics, logs, traces)"
        if "(sidecar/" in frame:
            return "the sidecar's own code"
        if "Runner.run (asyncio/" in frame:
            return "the event loop (uvloop, asyncio)"
        if not any(part in frame for part in SHARED):
            return "structlog, prometheus_client, native and other"
    return "structlog, prometheus_client, native and other"


def summarize(raw: str) -> None:
    owners: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = in_client = 0
    for line in raw.splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text:
            continue
        stack, count = stack_text.split(";"), int(count_text)
        owners[owner_of(stack)] += count
        leaves[stack[-1]] += count
        in_client += count if any(client_frame(frame) for frame in stack) else 0
        # A function counts once per sample however often it is on the stack.
        for function in {frame.partition(":")[0] for frame in stack if "(sidecar/" in frame}:
            inclusive[function] += count
        total += count
    print(f"\n{total} samples, self time by owner\n| owner | share |\n|---|---|")
    for owner, count in owners.most_common():
        print(f"| {owner} | {count / total:.1%} |")
    print(f"\nthe upstream client inclusive (a client frame on the stack): {in_client / total:.1%}")
    print("\nlargest frames (self time)")
    for frame, count in leaves.most_common(15):
        print(f"{count / total:6.1%}  {frame}")
    print("\nthe sidecar's functions, inclusive (below the handler)")
    below_handler = [
        (function, count)
        for function, count in inclusive.most_common()
        if count < inclusive.get("Proxy.handle (sidecar/serve/proxy.py", total)
    ]
    for function, count in below_handler[:20]:
        print(f"{count / total:6.1%}  {function})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="the sidecar tree")
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    tree = str(args.tree.resolve())
    with tempfile.TemporaryDirectory(prefix="profile-sidecar-") as workdir:
        bench = Bench(Path(workdir))
        upstream_port, port = free_port(), free_port()
        upstream = nginx_config(
            bench.workdir,
            "upstream",
            f"""server {{ listen 127.0.0.1:{upstream_port} backlog=4096;
                  location / {{ default_type application/json; return 200 '{OK_JSON}'; }} }}""",
        )
        try:
            bench.start("upstream", LOAD_CORE, "nginx", "-c", str(upstream), "-p", workdir)
            sidecar = bench.start(
                "sidecar",
                PROXY_CORE,
                PYTHON,
                "-c",
                f"import sys; sys.path.insert(0, {tree!r}); import runpy;"
                "runpy.run_module('sidecar', run_name='__main__')",
                "serve",
                "--upstream",
                f"http://127.0.0.1:{upstream_port}",
                "--port",
                str(port),
                "--admin-port",
                str(free_port()),
                env=SIDECAR_ON_LOOPBACK,
            )
            wait_for_port(upstream_port)
            wait_for_port(port)
            wrk(port, 64, 1)  # warm up
            raw = Path(workdir) / "raw.txt"
            spy = subprocess.Popen(
                [
                    *("py-spy", "record", "-r", "200", "-f", "raw", "-o", str(raw)),
                    *("-d", str(round(args.seconds)), "-p", str(sidecar.process.pid)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # py-spy attached before the load starts
            result = wrk(port, 64, args.seconds + 1)
            spy.wait(timeout=args.seconds + 30)
            bench.check_alive()
        finally:
            bench.stop_all()
        print(f"{tree}: {result.requests_per_s:.0f} req/s under the profiler, c=64")
        summarize(raw.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
