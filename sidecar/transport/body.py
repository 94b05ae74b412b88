"""An answer's body as it arrives: fed by the connection, read by the inspection or relay."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol


class Reading(Protocol):
    """The connection under a body: told to stop reading the socket while the body's
    reader falls behind, and to go on once it catches up."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class BodyStream:
    """Chunks in arrival order, then the end or the exception that cut the body short.

    Past ``high_water`` unread bytes the connection stops reading, so a slow agent holds
    back the tool (TCP's own backpressure) instead of filling the sidecar's memory.
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
    )

    def __init__(self, reading: Reading, high_water: int) -> None:
        self._reading = reading
        self._high_water = high_water
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._exception: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._on_eof: list[Callable[[], None]] = []

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > self._high_water:
            self._reading.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()
        callbacks, self._on_eof = self._on_eof, []
        for callback in callbacks:
            callback()

    def set_exception(self, exc: BaseException) -> None:
        """The body ends here without its end: the reader gets ``exc`` after what came."""
        if self._eof or self._exception is not None:
            return
        self._exception = exc
        self._wake()

    def is_eof(self) -> bool:
        """Whether the whole body has arrived (some of it may still be unread)."""
        return self._eof

    def on_eof(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the whole body has arrived (now, if it has)."""
        if self._eof:
            callback()
        else:
            self._on_eof.append(callback)

    async def readany(self) -> bytes:
        """The next bytes that arrived; ``b""`` at the end."""
        while not self._chunks:
            if self._eof:
                return b""
            if self._exception is not None:
                raise self._exception
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft() if len(self._chunks) == 1 else self._take_all()
        self._size -= len(chunk)
        if self._size <= self._high_water // 2:
            self._reading.resume_reading()
        return chunk

    def _take_all(self) -> bytes:
        chunk = b"".join(self._chunks)
        self._chunks.clear()
        return chunk

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
