"""The sidecar as a child process: the installed console script, in a clean environment."""

from __future__ import annotations

import asyncio
import json
import os
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


@asynccontextmanager
async def sidecar_process(
    upstream: str, env: dict[str, str] | None = None
) -> AsyncIterator[RunningSidecar]:
    """``tool-retry-sidecar serve`` in a child process on free ports; killed if it outlives us.

    Its stderr joins its stdout in ``lines``: every byte it writes is there, and its first
    line must be ``sidecar_started``.
    """
    process = await asyncio.create_subprocess_exec(
        CONSOLE_SCRIPT,
        "serve",
        "--upstream",
        upstream,
        "--port",
        "0",
        "--admin-port",
        "0",
        env=clean_env(SIDECAR_HOST="127.0.0.1", **(env or {})),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    first = await asyncio.wait_for(process.stdout.readline(), timeout=20)
    started = json.loads(first)
    assert started["event"] == "sidecar_started"
    running = RunningSidecar(process, started)
    running.lines.append(first.decode())
    try:
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
