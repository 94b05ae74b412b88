"""ASGI tools (FastAPI, MCP SDK servers) served by uvicorn on loopback in the caller's loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn


class _GuestServer(uvicorn.Server):
    """uvicorn inside a loop it does not own: the host keeps its signal handlers (several
    servers at once would otherwise restore each other's handlers out of order), and
    learns when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def uvicorn_serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) as uvicorn would in production; its base URL.

    Work still running at the end (a slow tool whose caller went away) is cancelled at once:
    what the caller checks has happened by then, and waiting would only make it slower.
    """
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        # Cancelling those slow tools is logged as errors; the tool's answers say what matters.
        log_level="critical",
        access_log=False,
        timeout_graceful_shutdown=0,
    )
    server = _GuestServer(config)
    serving = asyncio.create_task(server.serve())
    listening = asyncio.create_task(server.listening.wait())
    try:
        async with asyncio.timeout(10):
            await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not listening.done():
            serving.result()
            raise RuntimeError("uvicorn stopped before it started")
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        listening.cancel()
        server.should_exit = True
        await serving


async def read_body(receive: Any) -> bytes | None:
    """An ASGI request's whole body; ``None`` when the caller went away first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying(body: bytes, receive: Any) -> Any:
    """``receive`` that gives the body already read first."""
    given = False

    async def again() -> Any:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again
