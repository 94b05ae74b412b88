"""The processes a benchmark starts: each one remembered, and each one stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Loopback, as by default, written out so a shell's SIDECAR_HOST cannot move a benchmark
# off it. This changes where it listens, nothing of how it behaves.
SIDECAR_ON_LOOPBACK = {"SIDECAR_HOST": "127.0.0.1", "SIDECAR_ADMIN_HOST": "127.0.0.1"}


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Bench:
    workdir: Path
    running: list[Running] = field(default_factory=list)

    def start(
        self,
        name: str,
        core: str | None,
        *command: str,
        env: dict[str, str] | None = None,
        inherit_env: bool = True,
        keep_stdout: bool = False,
    ) -> Running:
        """Start ``command``, pinned to ``core`` with taskset unless that is ``None``; its
        stderr goes to ``<workdir>/<name>.err``, and with ``keep_stdout`` its stdout to
        ``<workdir>/<name>.out`` (the sidecar's log lines), else nowhere.
        ``inherit_env=False``: ``env`` is all it gets."""
        pinned = ["taskset", "-c", core] if core is not None else []
        with contextlib.ExitStack() as files:
            errors = files.enter_context(open(self.workdir / f"{name}.err", "wb"))
            output = (
                files.enter_context(open(self.workdir / f"{name}.out", "wb"))
                if keep_stdout
                else subprocess.DEVNULL
            )
            process = subprocess.Popen(
                [*pinned, *command],
                stdout=output,
                stderr=errors,
                env={**(os.environ if inherit_env else {}), **(env or {})},
            )
        running = Running(name, process)
        self.running.append(running)
        return running

    def check_alive(self) -> None:
        """Stop with the process's own words if anything we started has died."""
        for running in self.running:
            if running.process.poll() is not None:
                errors = (self.workdir / f"{running.name}.err").read_text(errors="replace")
                raise RuntimeError(f"{running.name} exited: {errors[-2000:]}")

    def stop(self, running: Running) -> None:
        running.stop()
        self.running.remove(running)

    def stop_all(self) -> None:
        for running in reversed(self.running):
            running.stop()
        self.running.clear()


def wait_for_port(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tree_serve(tree: Path, *arguments: str) -> list[str]:
    """``serve arguments…`` from the sidecar in ``tree``, ahead of the installed (editable)
    project."""
    return [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(tree)!r}); import sidecar, runpy;"
        f"assert sidecar.__file__.startswith({str(tree)!r}), sidecar.__file__;"
        "runpy.run_module('sidecar', run_name='__main__')",
        "serve",
        *arguments,
    ]


def tree_command(tree: Path, upstream: str, port: int) -> list[str]:
    """``serve`` from the sidecar in ``tree`` in front of ``upstream``."""
    return tree_serve(
        tree, "--upstream", upstream, "--port", str(port), "--admin-port", str(free_port())
    )


# A sleeper's period: a core that wakes this often never halts for long.
AWAKE_TICK_S = 0.002


@contextlib.contextmanager
def cores_kept_awake(cores: list[str]) -> Iterator[None]:
    """One process per core that sleeps ``AWAKE_TICK_S`` at a time, while the block runs.

    On this kind of VM an idle vCPU halts, and waking it when a packet arrives took
    milliseconds: at c=64 the sidecar then sat idle 60% of a run with 64 requests waiting
    (0.38 of a core busy, 756 req/s, p99 501 ms), and so did the bare aiohttp proxy
    (0.38, 680 req/s). With a 2 ms sleeper on its core the same sidecar ran 1,776 req/s at
    0.87 of a core, p99 114 ms: that wait was the host's wake-up, not the proxy's. The
    sleepers cost next to no CPU and keep every proxy measured at the CPU's speed alike.
    """
    code = f"import time\nwhile True: time.sleep({AWAKE_TICK_S})"
    sleepers = [
        subprocess.Popen(["taskset", "-c", core, sys.executable, "-c", code]) for core in cores
    ]
    try:
        yield
    finally:
        for sleeper in sleepers:
            sleeper.terminate()
            sleeper.wait()
