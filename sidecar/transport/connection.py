"""One socket to a tool, carrying one request at a time, and how far a request got on it.

A connection's ``ConnectionState`` says whether it may carry the next request (as
httpcore's ``HTTPConnectionState`` does): it is ``IDLE`` again only when its answer ended
exactly where the bytes read so far end and the request was all written. Anything after
the answer, anything that arrives while the connection is idle, an answer that says
``Connection: close`` or a malformed one makes it ``MUST_CLOSE``, so no tool's stray bytes
can become the answer to the next request.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import cast

from sidecar.bugs import SidecarBug
from sidecar.transport.answer import AnswerParser, Head, MalformedAnswer
from sidecar.wire.body import BodyStream

# Unread body bytes past which the socket stops being read.
_READ_HIGH_WATER = 2**17
# An idle connection older than this is not trusted to be open at the tool any more
# (aiohttp's client keeps one as long).
IDLE_TIMEOUT_S = 15.0

PoolKey = tuple[bool, str, int]
RequestBody = bytes | AsyncIterable[bytes]


class Stage(enum.IntEnum):
    """How far one request got; it tells a pool wait, a connect and a sent request apart."""

    STARTED = 0
    QUEUED = 1  # waiting for a free connection in the pool
    CONNECTING = 2
    CONNECTED = 3
    SENT = 4  # the request's head was written to the tool's socket


@dataclass(slots=True)
class Progress:
    """Read by the caller when the request fails, or when its own timeout cuts it."""

    stage: Stage = Stage.STARTED


class ConnectionState(enum.Enum):
    IDLE = "idle"  # open, between requests: may carry the next one
    ACTIVE = "active"  # carrying a request: its body being written or its answer read
    MUST_CLOSE = "must_close"  # carrying a request, and will carry no other
    CLOSED = "closed"


class ConnectionEvent(enum.Enum):
    SEND = "send"  # a request's head goes out
    ANSWER_WHOLE = "answer_whole"  # the answer ended, nothing after it, the request all written
    CLOSE_ASKED = "close_asked"  # the answer's head said no keep-alive (or HTTP/1.0)
    OUT_OF_STEP = "out_of_step"  # malformed, bytes after the answer or unasked for, a late head
    CLOSED = "closed"  # the socket closed, or is being closed


_I, _A, _M, _C = (
    ConnectionState.IDLE,
    ConnectionState.ACTIVE,
    ConnectionState.MUST_CLOSE,
    ConnectionState.CLOSED,
)
_E = ConnectionEvent
# Every (state, event) that can happen; anything else is a bug in the connection.
TRANSITIONS: dict[tuple[ConnectionState, ConnectionEvent], ConnectionState] = {
    (_I, _E.SEND): _A,
    (_I, _E.OUT_OF_STEP): _M,
    (_A, _E.ANSWER_WHOLE): _I,
    (_A, _E.CLOSE_ASKED): _M,
    (_A, _E.OUT_OF_STEP): _M,
    (_M, _E.ANSWER_WHOLE): _M,
    (_M, _E.CLOSE_ASKED): _M,
    (_M, _E.OUT_OF_STEP): _M,
    **{(state, _E.CLOSED): _C for state in ConnectionState},
    **{(_C, event): _C for event in ConnectionEvent if event is not _E.SEND},
}


def next_state(state: ConnectionState, event: ConnectionEvent) -> ConnectionState:
    """The state after ``event``; a step the table lacks (a request sent on a connection
    that is not idle) is the sidecar's bug, not the tool's reset."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise SidecarBug(f"{event.value} on a connection that is {state.value}") from None


class ConnectionBroken(Exception):
    """The tool's connection closed before its answer ended."""


class Connection(asyncio.Protocol):
    """One socket to a tool, carrying one request at a time."""

    __slots__ = (
        "_body",
        "_drain_waiter",
        "_head_waiter",
        "_on_lost",
        "_parser",
        "_read_paused",
        "_write_paused",
        "_writer",
        "idle_since",
        "key",
        "max_head_bytes",
        "state",
        "transport",
    )

    def __init__(
        self, key: PoolKey, max_head_bytes: int, on_lost: Callable[[Connection], None]
    ) -> None:
        self._on_lost = on_lost  # the pool forgets a connection the tool closed
        self.key = key
        self.max_head_bytes = max_head_bytes
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None
        self._head_waiter: asyncio.Future[tuple[Head, BodyStream]] | None = None
        self._parser: AnswerParser | None = None
        self._body: BodyStream | None = None
        self._writer: asyncio.Task[None] | None = None
        self.state = ConnectionState.IDLE
        self._read_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an ``asyncio.Transport`` subclass).
        self.transport = cast(asyncio.Transport, transport)

    def step(self, event: ConnectionEvent) -> None:
        self.state = next_state(self.state, event)

    def usable(self, now: float) -> bool:
        transport = self.transport
        return (
            self.state is ConnectionState.IDLE
            and transport is not None
            and not transport.is_closing()
            and now - self.idle_since < IDLE_TIMEOUT_S
        )

    def wait_for_request(self) -> None:
        """Idle in the pool: anything the tool sends now is out of step."""
        self._head_waiter = None
        self._parser = None
        self._body = None

    async def exchange(
        self,
        method: str,
        head: bytes,
        body: RequestBody,
        chunked: bool,
        progress: Progress,
        deadline: float,
    ) -> tuple[Head, BodyStream]:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionBroken("the connection closed before the request was sent")
        self.step(ConnectionEvent.SEND)
        loop = asyncio.get_running_loop()
        # A parser per answer: nothing one answer left behind can shape the next.
        self._parser = AnswerParser(self, method, self.max_head_bytes)
        waiter: asyncio.Future[tuple[Head, BodyStream]] = loop.create_future()
        self._head_waiter = waiter
        self._body = None
        self._writer = None
        if isinstance(body, bytes):
            transport.write(head + body if body else head)
        else:
            transport.write(head)
            self._writer = loop.create_task(self._write_body(body, chunked))
        progress.stage = Stage.SENT
        timer = loop.call_at(deadline, _time_out, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def _write_body(self, body: AsyncIterable[bytes], chunked: bool) -> None:
        """A streamed request body: as it came when its length was declared, else chunked."""
        try:
            async for chunk in body:
                transport = self.transport
                if transport is None:
                    return
                if not chunk:
                    continue
                if chunked:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                else:
                    transport.write(chunk)
                if self._write_paused:
                    self._drain_waiter = asyncio.get_running_loop().create_future()
                    await self._drain_waiter
            if chunked and self.transport is not None:
                self.transport.write(b"0\r\n\r\n")
        except Exception as exc:
            self._break(ConnectionBroken(f"the request body failed: {exc!r}"))

    def _break(self, exc: Exception) -> None:
        """This connection cannot carry its exchange on: whoever waits for the answer's
        head, or reads its body, gets ``exc``."""
        self.step(ConnectionEvent.OUT_OF_STEP)
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        elif self._body is not None:
            self._body.set_exception(exc)
        self.close()

    # asyncio.Protocol: the bytes of the answer.

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            self.close()  # bytes nobody asked for: this connection is out of step
            return
        try:
            parser.feed(data)
        except MalformedAnswer as exc:
            self._break(exc)
            return
        if parser.trailing:
            # The answer is whole; what follows it is nobody's, and the connection goes.
            self.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        parser = self._parser
        if parser is not None and not parser.feed_eof():
            self._break(ConnectionBroken(f"the tool closed the connection ({exc!r})"))
        self.step(ConnectionEvent.CLOSED)
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
        self._wake_writer()
        self._on_lost(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def _wake_writer(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # AnswerSink: what the parser read.

    def answer_head(self, head: Head) -> None:
        if not head.keep_alive:
            self.step(ConnectionEvent.CLOSE_ASKED)
        body = self._body = BodyStream(self, _READ_HIGH_WATER)
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result((head, body))
        else:
            self.step(ConnectionEvent.OUT_OF_STEP)  # the head came after the request's timeout

    def answer_body(self, chunk: bytes) -> None:
        assert self._body is not None
        self._body.feed(chunk)

    def answer_end(self) -> None:
        assert self._body is not None and self._parser is not None
        # Decided before the body's end is told: its reader gives the connection back then.
        # An answer that ends before the request was all written leaves the tool reading
        # what the next request would follow (Envoy closes such a connection too).
        written = self._writer is None or self._writer.done()
        whole = written and not self._parser.trailing
        self.step(ConnectionEvent.ANSWER_WHOLE if whole else ConnectionEvent.OUT_OF_STEP)
        self._body.feed_eof()

    # Reading: a body's reader that falls behind holds the tool back.

    def pause_reading(self) -> None:
        if self.transport is not None and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.step(ConnectionEvent.CLOSED)
        transport = self.transport
        if transport is not None:
            transport.close()
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()


def _time_out(waiter: asyncio.Future[tuple[Head, BodyStream]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
