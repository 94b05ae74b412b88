"""HTTP spoken byte by byte: tools that misbehave on purpose, and agents that send raw bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_tool(handler: RawHandler) -> AsyncIterator[str]:
    """A TCP server on loopback that answers whatever bytes ``handler`` writes; its URL.
    A handler still running when the test leaves is cancelled and awaited: left pending, it
    is destroyed after the test's loop has closed, and its ``writer.close()`` fails then."""
    running: set[asyncio.Task[object]] = set()

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        running.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            running.discard(task)

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await server.wait_closed()


async def read_request_head(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


def reply_then(
    reply: bytes, then: Callable[[asyncio.StreamReader], Awaitable[object]] | None = None
) -> RawHandler:
    """A tool that answers each request with ``reply``, then does ``then`` if given."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        writer.write(reply)
        await writer.drain()
        if then is not None:
            await then(reader)

    return handler


async def raw_exchange(port: int, request: bytes, *, until_closed: bool = False) -> bytes:
    """Send ``request`` as it is to 127.0.0.1:``port``; what came back within 5 s: the first
    read, or with ``until_closed`` all until the server closed the connection (then it is
    done with the request: nothing it does afterwards can be about it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(
            reader.read() if until_closed else reader.read(65536), timeout=5
        )
    finally:
        writer.close()
