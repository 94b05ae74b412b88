"""The walk of one request through the package: the modules it enters, in order.

A tool on loopback answers ``503`` and then ``200``; the sidecar (the tree given, ahead of
the installed project) forwards one ``POST``, its waits cut to nothing. A profile hook
records each call into a module of the package while ``Engine.run`` is on the stack (a
coroutine's resumptions are not calls); consecutive calls within one module are one visit.
A return is a visit to a module the walk had already left.

    python bench/walk.py --tree /tmp/before --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import asyncio, sys
tree = sys.argv[1]
sys.path.insert(0, tree)
from aiohttp import ClientSession, web
from sidecar.config import load_settings
from sidecar.serve.app import create_app, proxy_server, running
import sidecar

package = sidecar.__file__.rsplit("/", 1)[0] + "/"
assert package.startswith(tree), package
visits = []
depth = 0
entered = []  # every frame entered, kept so that no id is reused
entered_ids = set()

def profile(frame, event, arg):
    global depth
    name = frame.f_code.co_filename
    if event == "call" and frame.f_code.co_name == "run" and name.endswith("retry/engine.py"):
        depth += 1
    if depth and event == "call" and name.startswith(package) and id(frame) not in entered_ids:
        # A coroutine that resumes is called again: only its first call is a visit.
        entered.append(frame)
        entered_ids.add(id(frame))
        module = name[len(package):-3]
        if not visits or visits[-1] != module:
            visits.append(module)
    if event == "return" and frame.f_code.co_name == "run" and name.endswith("retry/engine.py"):
        depth -= 1

async def main():
    answers = [503, 200]
    async def tool(request):
        await request.read()
        status = answers.pop(0) if len(answers) > 1 else answers[0]
        return web.json_response({"success": status == 200}, status=status)
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", tool)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    async def no_wait(seconds):
        return None
    configuration = load_settings(upstream_url=f"http://127.0.0.1:{port}")
    # From 0.5 the app is built from the served records.
    configuration = configuration.served() if hasattr(configuration, "served") else configuration
    sidecar_app = create_app(configuration, sleep=no_wait)
    async with running(sidecar_app):
        agents = proxy_server(sidecar_app, configuration)
        if hasattr(agents, "start"):  # from 0.6 the agents' side is a server of its own
            await agents.start("127.0.0.1", 0, backlog=128)
            proxy_port = agents.port
        else:
            server = web.ServerRunner(agents)
            await server.setup()
            await web.TCPSite(server, "127.0.0.1", 0).start()
            proxy_port = server.addresses[0][1]
        async with ClientSession() as client:
            url = f"http://127.0.0.1:{proxy_port}/weather"
            sys.setprofile(profile)
            async with client.post(url, json={"city": "Tokyo"}) as answer:
                await answer.read()
            sys.setprofile(None)
            assert answer.status == 200, answer.status
        await (agents.close(0.25) if hasattr(agents, "start") else server.cleanup())
    await runner.cleanup()

asyncio.run(main())
print("\n".join("visit " + module for module in visits))
"""


def walk(tree: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tree.resolve())],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("visit ")]


def returns(visits: list[str]) -> int:
    """Visits to a module the walk had already left."""
    seen: set[str] = set()
    count = 0
    for module in visits:
        count += module in seen
        seen.add(module)
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", default=[])
    args = parser.parse_args()
    for tree in args.tree:
        visits = walk(tree)
        print(
            f"## {tree}: {len(visits)} visits, {len(set(visits))} modules, "
            f"{returns(visits)} returns"
        )
        print(" → ".join(visits))
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
