"""A body as it arrives, on either side: an agent's request body, fed by its connection and
read by the proxy, and a tool's answer body, fed by the tool's and read by the inspection
or the relay. And the timeout for reading one.

"At the end" has the meaning aiohttp's ``StreamReader`` gives it: ``is_eof``, the whole
body has arrived (some of it may still be unread); ``at_eof``, it has all been read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol


class Reading(Protocol):
    """The connection under a body: told to stop reading the socket while the body's
    reader falls behind, and to go on once it catches up."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class BodyStream:
    """Chunks in arrival order, then the end or the exception that cut the body short.

    Past ``high_water`` unread bytes the connection stops reading, so a slow reader holds
    back its peer (TCP's own backpressure) instead of filling the sidecar's memory; it
    reads again once half of them are read. A reader waiting for more than that at once
    (``readexactly``) raises the mark for as long as it waits.
    """

    __slots__ = (
        "_chunks",
        "_eof",
        "_exception",
        "_high_water",
        "_on_eof",
        "_reading",
        "_size",
        "_waiter",
        "_wanted",
    )

    def __init__(self, reading: Reading, high_water: int) -> None:
        self._reading = reading
        self._high_water = high_water
        self._wanted = high_water
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._exception: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._on_eof: list[Callable[[], None]] = []

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > self._wanted:
            self._reading.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()
        callbacks, self._on_eof = self._on_eof, []
        for callback in callbacks:
            callback()

    def set_exception(self, exc: BaseException) -> None:
        """The body ends here without its end: the reader gets ``exc`` after what came.
        Once the whole body has arrived, nothing can cut it short."""
        if self._eof or self._exception is not None:
            return
        self._exception = exc
        self._wake()

    def abandon(self, exc: BaseException) -> None:
        """The connection is gone: what is buffered will never be read; the reader gets
        ``exc`` even when the whole body had arrived."""
        self._chunks.clear()
        self._size = 0
        self._exception = exc
        self._wake()

    def is_eof(self) -> bool:
        """Whether the whole body has arrived (some of it may still be unread)."""
        return self._eof

    def at_eof(self) -> bool:
        """Whether the whole body has arrived and been read."""
        return self._eof and not self._chunks

    def on_eof(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the whole body has arrived (now, if it has)."""
        if self._eof:
            callback()
        else:
            self._on_eof.append(callback)

    async def readany(self) -> bytes:
        """What has arrived (waiting for some), or ``b""`` at the end."""
        while not self._chunks:
            if self._exception is not None:
                raise self._exception
            if self._eof:
                return b""
            await self._wait()
        if len(self._chunks) == 1:
            return self._taken(self._chunks.popleft())
        if self._size > self._high_water:
            return self._taken(self._chunks.popleft())  # a backlog goes a chunk at a time
        chunk = b"".join(self._chunks)
        self._chunks.clear()
        return self._taken(chunk)

    async def readexactly(self, size: int) -> bytes:
        """``size`` bytes; ``IncompleteReadError`` when the body ends before them."""
        if size > self._wanted:
            self._wanted = size
            self._reading.resume_reading()
        try:
            while self._size < size:
                if self._exception is not None:
                    raise self._exception
                if self._eof:
                    partial = b"".join(self._chunks)
                    self._chunks.clear()
                    raise asyncio.IncompleteReadError(self._taken(partial), size)
                await self._wait()
        finally:
            self._wanted = self._high_water
        data = b"".join(self._chunks)
        self._chunks.clear()
        if len(data) > size:
            self._chunks.append(data[size:])
            data = data[:size]
        return self._taken(data, kept=self._size - size)

    def _taken(self, chunk: bytes, kept: int | None = None) -> bytes:
        self._size = self._size - len(chunk) if kept is None else kept
        if self._size <= self._wanted // 2:
            self._reading.resume_reading()
        return chunk

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def read_deadline(body: BodyStream, timeout_s: float) -> AbstractAsyncContextManager[object]:
    """A timeout for reading ``body``, or none when the whole body has already arrived.

    A small body usually arrives with its head: reading it cannot wait, and arming and
    cancelling a timer for it cost ~3% of the CPU per request.
    """
    return contextlib.nullcontext() if body.is_eof() else asyncio.timeout(timeout_s)
