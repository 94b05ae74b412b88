"""Debian's headless Chromium, driven over its DevTools protocol with aiohttp's own websocket
client: no driver package, and nothing downloaded.

``headless_chromium`` starts the browser on a throwaway profile with the debugging port
chosen by the browser itself (read back from the profile's ``DevToolsActivePort``), and
stops it by its PID on the way out, whatever happened. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import eventually

# The flags that keep a headless browser to itself: no sandbox (a container's root), no
# GPU, and none of the background traffic a browser makes on its own.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


def find_chromium() -> str | None:
    """Debian's ``chromium`` on the PATH, or ``None``."""
    return shutil.which("chromium")


def chromium_or_skip() -> str:
    """The browser, or the test skipped with the reason; under CI (``CI`` set) a missing
    browser fails the test instead, so the browser tests cannot silently stop running."""
    binary = find_chromium()
    if binary is None:
        reason = (
            "no chromium on the PATH: the browser tests use Debian's "
            "(apt-get install -y --no-install-recommends chromium)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return binary


class DevTools:
    """One websocket to the browser: commands answered by id, events kept in order."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self._socket:
                data = json.loads(message.data)
                waiting = self._waiting.pop(data.get("id", 0), None)
                if waiting is None:
                    self.events.append(data)
                elif "error" in data:
                    waiting.set_exception(RuntimeError(f"DevTools: {data['error']}"))
                else:
                    waiting.set_result(data.get("result", {}))
        finally:
            for waiting in self._waiting.values():
                waiting.cancel()

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        number = next(self._ids)
        answer = self._waiting[number] = asyncio.get_running_loop().create_future()
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._socket.send_json(message)
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            return await answer

    async def close(self) -> None:
        await self._socket.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Page:
    """One tab, through its DevTools session."""

    def __init__(self, devtools: DevTools, session: str) -> None:
        self._devtools = devtools
        self._session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._devtools.send(method, params, self._session)

    def events(self, method: str) -> list[dict[str, Any]]:
        """The parameters of each event ``method`` this tab sent so far."""
        return [
            event["params"]
            for event in self._devtools.events
            if event.get("sessionId") == self._session and event.get("method") == method
        ]

    async def evaluate(self, expression: str) -> Any:
        """``expression``'s value in the page, as JSON data."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, expression: str, timeout_s: float = 10.0) -> None:
        """Wait until ``expression`` is true in the page, looking again and again until
        ``timeout_s`` has passed."""
        await eventually(_Holds(self, expression), timeout_s)

    async def screenshot(self) -> bytes:
        """What the tab shows now, as a PNG image."""
        shot = await self.send("Page.captureScreenshot", {"format": "png"})
        return base64.b64decode(shot["data"])


class _Holds:
    """Whether an expression is true in a page; named by the expression, should a wait for
    it time out."""

    def __init__(self, page: Page, expression: str) -> None:
        self._page = page
        self._expression = expression

    async def __call__(self) -> bool:
        return bool(await self._page.evaluate(self._expression))

    def __repr__(self) -> str:
        return self._expression


class Browser:
    def __init__(self, devtools: DevTools) -> None:
        self._devtools = devtools

    async def open(self, url: str, width: int = 1280, height: int = 800) -> Page:
        """A new tab of ``width`` x ``height`` CSS pixels at ``url``, recording its network
        requests and its script errors as events."""
        target = await self._devtools.send("Target.createTarget", {"url": "about:blank"})
        attached = await self._devtools.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self._devtools, attached["sessionId"])
        for domain in ("Page", "Network", "Runtime"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )
        await page.send("Page.navigate", {"url": url})
        return page


@contextlib.asynccontextmanager
async def headless_chromium(binary: str, workdir: Path) -> AsyncIterator[Browser]:
    """Chromium on a fresh profile under ``workdir``; stopped by its PID on exit."""
    profile = workdir / "chromium-profile"
    process = await asyncio.create_subprocess_exec(
        binary, *FLAGS, f"--user-data-dir={profile}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    said: deque[bytes] = deque(maxlen=40)  # the end of what it wrote, should it fail
    listening = asyncio.create_task(_lines(process, said))
    try:
        port_file = profile / "DevToolsActivePort"
        await eventually(
            lambda: process.returncode is not None or port_file.exists(), START_TIMEOUT_S
        )
        assert process.returncode is None, b"".join(said).decode(errors="replace")
        await eventually(lambda: len(port_file.read_text().splitlines()) == 2, START_TIMEOUT_S)
        port, path = port_file.read_text().splitlines()
        async with aiohttp.ClientSession() as session:
            socket = await session.ws_connect(
                f"ws://127.0.0.1:{port}{path}", max_msg_size=64 * 1024 * 1024
            )
            devtools = DevTools(socket)
            try:
                yield Browser(devtools)
            finally:
                await devtools.close()
    finally:
        await _stop(process)
        await asyncio.wait_for(listening, STOP_TIMEOUT_S)


async def _lines(process: asyncio.subprocess.Process, into: deque[bytes]) -> None:
    assert process.stderr is not None
    async for line in process.stderr:
        into.append(line)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the browser's PID; SIGKILL if it has not exited in ``STOP_TIMEOUT_S``."""
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
