"""The sidecar as a child process: the installed console script, in a clean environment."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

# The script pip installed beside this interpreter, as a user would run it.
CONSOLE_SCRIPT = str(Path(sys.executable).with_name("tool-retry-sidecar"))


def clean_env(**variables: str) -> dict[str, str]:
    """This process's environment without any sidecar setting, plus ``variables``."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SIDECAR_", "GOMIND_AGENT_", "OPENAI_"))
    }
    return {**inherited, **variables}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CONSOLE_SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(**(env or {})),
    )


class RunningSidecar:
    def __init__(self, process: asyncio.subprocess.Process, started: dict[str, Any]) -> None:
        self.process = process
        self.proxy = f"http://127.0.0.1:{started['proxy_port']}"
        self.admin = f"http://127.0.0.1:{started['admin_port']}"
        self.lines: list[str] = []

    async def read_lines_until_exit(self) -> int:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.lines.append(line.decode())
        return await self.process.wait()

    def logged(self) -> list[dict[str, Any]]:
        """Every line written so far, each a JSON object."""
        return [json.loads(line) for line in self.lines]


async def _lines_until_started(process: asyncio.subprocess.Process) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or json.loads(lines[-1])["event"] != "sidecar_started":
        line = (await process.stdout.readline()).decode()
        assert line, f"exited before it started: {lines}"
        lines.append(line)
    return lines


async def kill_if_running(process: asyncio.subprocess.Process) -> None:
    """SIGKILL to a child this test started, unless it has exited; then reap it."""
    if process.returncode is None:
        process.kill()
        await process.wait()


@asynccontextmanager
async def sidecar_process(
    upstream: str,
    env: dict[str, str] | None = None,
    *,
    command: tuple[str, ...] = ("serve",),
    max_fds: int | None = None,
) -> AsyncIterator[RunningSidecar]:
    """``tool-retry-sidecar serve`` in a child process on free ports; killed if it outlives us.

    Its stderr joins its stdout in ``lines``: every byte it writes is there. ``max_fds``
    limits its file descriptors.
    """

    def limit_descriptors() -> None:
        if max_fds is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_fds, max_fds))

    process = await asyncio.create_subprocess_exec(
        CONSOLE_SCRIPT,
        *command,
        "--upstream",
        upstream,
        "--port",
        "0",
        "--admin-port",
        "0",
        env=clean_env(SIDECAR_HOST="127.0.0.1", **(env or {})),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=limit_descriptors,
    )
    try:
        lines = await asyncio.wait_for(_lines_until_started(process), timeout=20)
        running = RunningSidecar(process, json.loads(lines[-1]))
        running.lines.extend(lines)
        yield running
    finally:
        await kill_if_running(process)
