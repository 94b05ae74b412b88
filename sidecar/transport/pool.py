"""A pooled HTTP/1.1 client to the tools, on asyncio protocols and a strict answer parser.

aiohttp's ``ClientSession`` builds a request and a response object model per call,
resolves and caches names, arms its own timers and hands connections through a general
connector; under load that was ~29% of the sidecar's CPU. A proxy needs less: write the
head the agent's request already holds, read the answer's head, and pass the body on.

A connection carries one request at a time and is reused only when its answer ended
exactly where the bytes read so far end: anything after it, or anything that arrives while
the connection is idle, closes it, so no tool's stray bytes can become the answer to the
next request. The pool never resends a request by itself: a kept-alive connection that
drops under a request is that attempt's failure, for the caller's replay rules to judge.
"""

from __future__ import annotations

import asyncio
import enum
import ssl
import time
from collections import deque
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import cast

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.transport.answer import AnswerParser, Framing, Head, MalformedAnswer
from sidecar.transport.body import BodyStream

RequestBody = bytes | AsyncIterable[bytes]

# Unread body bytes past which the socket stops being read.
_READ_HIGH_WATER = 2**17
# An idle connection older than this is not trusted to be open at the tool any more
# (aiohttp's client keeps one as long).
_IDLE_TIMEOUT_S = 15.0

_PoolKey = tuple[bool, str, int]


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


class ConnectionBroken(Exception):
    """The tool's connection closed before its answer ended."""


class Pool:
    """Connections to the tools, at most ``limit`` in use at once (0: no limit).

    ``max_head_bytes`` bounds an answer's head (status line and header fields).
    """

    def __init__(self, limit: int, max_head_bytes: int) -> None:
        self._limit = limit
        self._max_head_bytes = max_head_bytes
        self._in_use = 0
        self._idle: dict[_PoolKey, list[_Connection]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def request(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: RequestBody,
        progress: Progress,
        timeout_s: float,
    ) -> Response:
        """Send one request and wait for its answer's head; the body streams after.

        ``timeout_s`` bounds the wait for a connection, connecting, and the wait for the
        head (``TimeoutError``); ``progress`` tells how far the request got. An answer
        that is not valid HTTP/1.1 raises ``MalformedAnswer``.
        """
        host = url.raw_host or ""
        tls = url.scheme == "https"
        key = (tls, host, url.port or (443 if tls else 80))
        deadline = asyncio.get_running_loop().time() + timeout_s
        progress.stage = Stage.QUEUED
        connection = self._take_idle(key)
        if connection is None:
            # Only a wait for a slot or a connect needs asyncio's timeout; a kept
            # connection goes to the tool at once, and its own timer covers the answer.
            async with asyncio.timeout_at(deadline):
                connection = await self._acquire(key, progress)
        progress.stage = Stage.CONNECTED
        # A streamed body without a declared length goes chunked.
        chunked = not isinstance(body, bytes) and "Content-Length" not in headers
        try:
            head, body_stream = await connection.exchange(
                method,
                _head(url, method, headers, body, chunked),
                body,
                chunked,
                progress,
                deadline,
            )
        except BaseException:
            self.release(connection, reuse=False)
            raise
        return Response(self, connection, head, body_stream)

    async def close(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    def _take_idle(self, key: _PoolKey) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable(now):
                self._in_use += 1
                return connection
            connection.close()
        return None

    async def _acquire(self, key: _PoolKey, progress: Progress) -> _Connection:
        """A connection kept for ``key`` or a new one, once the limit lets one more in."""
        while True:
            connection = self._take_idle(key)
            if connection is not None:
                return connection
            if not self._limit or self._in_use < self._limit:
                break
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # the slot it was woken for goes to the next in line
                elif waiter in self._waiters:  # a wake-up may have dropped it already
                    self._waiters.remove(waiter)
                raise
        self._in_use += 1
        progress.stage = Stage.CONNECTING
        try:
            return await self._open(key)
        except BaseException:
            self._in_use -= 1
            self._wake_one()
            raise

    async def _open(self, key: _PoolKey) -> _Connection:
        tls, host, port = key
        loop = asyncio.get_running_loop()
        if tls and self._tls is None:
            # Made on the first https connection only: loading the trust store blocks the
            # loop once, and holds memory a sidecar in front of plain-http tools never needs.
            self._tls = _verifying_context()
        _, connection = await loop.create_connection(
            lambda: _Connection(self, key, self._max_head_bytes),
            host.strip("[]"),
            port,
            ssl=self._tls if tls else None,
            server_hostname=host if tls else None,
        )
        return connection

    def release(self, connection: _Connection, *, reuse: bool) -> None:
        """Take ``connection`` back: kept for the next request, or closed."""
        self._in_use -= 1
        if reuse and not self._closed:
            connection.idle_since = time.monotonic()
            connection.wait_for_request()
            self._idle.setdefault(connection.key, []).append(connection)
        else:
            connection.close()
        self._wake_one()

    def forget(self, connection: _Connection) -> None:
        """An idle connection closed (the tool ended it): it is no longer offered."""
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _verifying_context() -> ssl.SSLContext:
    """What aiohttp's client used: the system's trust store, checked host names, and
    HTTP/1.1 said in ALPN so a server that could speak HTTP/2 does not."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(("http/1.1",))
    return context


def _head(
    url: URL, method: str, headers: CIMultiDict[str], body: RequestBody, chunked: bool
) -> bytes:
    """The request line and header block.

    ``headers`` hold the agent's ``Content-Length``, if it sent one, stating the length of
    ``body``. A buffered body the agent sent chunked gets its length. A request without a
    body gets no framing header.
    """
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            # It would end the field early and start a header (or a request) of its own.
            raise ValueError(f"header {name} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    if chunked:
        lines.append("Transfer-Encoding: chunked\r\n")
    elif isinstance(body, bytes) and body and "Content-Length" not in headers:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8")


class _Connection(asyncio.Protocol):
    """One socket to a tool, carrying one request at a time."""

    __slots__ = (
        "_body",
        "_chunked",
        "_drain_waiter",
        "_head_waiter",
        "_parser",
        "_pool",
        "_read_paused",
        "_should_close",
        "_write_paused",
        "_writer",
        "idle_since",
        "key",
        "max_head_bytes",
        "transport",
    )

    def __init__(self, pool: Pool, key: _PoolKey, max_head_bytes: int) -> None:
        self._pool = pool
        self.key = key
        self.max_head_bytes = max_head_bytes
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None
        self._head_waiter: asyncio.Future[tuple[Head, BodyStream]] | None = None
        self._parser: AnswerParser | None = None
        self._body: BodyStream | None = None
        self._writer: asyncio.Task[None] | None = None
        self._chunked = False
        self._should_close = False
        self._read_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an ``asyncio.Transport`` subclass).
        self.transport = cast(asyncio.Transport, transport)

    def usable(self, now: float) -> bool:
        transport = self.transport
        return (
            transport is not None
            and not transport.is_closing()
            and now - self.idle_since < _IDLE_TIMEOUT_S
        )

    def wait_for_request(self) -> None:
        """Idle in the pool: anything the tool sends now is out of step."""
        self._head_waiter = None
        self._parser = None
        self._body = None

    def reusable(self) -> bool:
        """Whether the next request may follow on this connection: the answer ended, and
        nothing came after it."""
        parser = self._parser
        return (
            not self._should_close
            and self.transport is not None
            and parser is not None
            and parser.done
            and not parser.trailing
            and (self._writer is None or self._writer.done())
        )

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
            self._chunked = chunked
            transport.write(head)
            self._writer = loop.create_task(self._write_body(body))
        progress.stage = Stage.SENT
        timer = loop.call_at(deadline, _time_out, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def _write_body(self, body: AsyncIterable[bytes]) -> None:
        """A streamed request body: as it came when its length was declared, else chunked."""
        try:
            async for chunk in body:
                transport = self.transport
                if transport is None:
                    return
                if not chunk:
                    continue
                if self._chunked:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                else:
                    transport.write(chunk)
                if self._write_paused:
                    self._drain_waiter = asyncio.get_running_loop().create_future()
                    await self._drain_waiter
            if self._chunked and self.transport is not None:
                self.transport.write(b"0\r\n\r\n")
        except Exception as exc:
            self._break(ConnectionBroken(f"the request body failed: {exc!r}"))

    def _break(self, exc: Exception) -> None:
        """This connection cannot carry its exchange on: whoever waits for the answer's
        head, or reads its body, gets ``exc``."""
        self._should_close = True
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
        self._should_close = True
        self.transport = None
        parser = self._parser
        if parser is not None and not parser.feed_eof():
            self._break(ConnectionBroken(f"the tool closed the connection ({exc!r})"))
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
        self._wake_writer()
        self._pool.forget(self)

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
            self._should_close = True
        body = self._body = BodyStream(self, _READ_HIGH_WATER)
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result((head, body))
        else:
            self._should_close = True  # the head came after the request's timeout

    def answer_body(self, chunk: bytes) -> None:
        assert self._body is not None
        self._body.feed(chunk)

    def answer_end(self) -> None:
        assert self._body is not None
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
        self._should_close = True
        transport = self.transport
        if transport is not None:
            transport.close()
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()


def _time_out(waiter: asyncio.Future[tuple[Head, BodyStream]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Response:
    """An answer's status and headers; its body streams from ``content``.

    The connection returns to the pool when the body has been read to its end, or goes
    with ``release``/``close``; it is reused only when the whole answer came and nothing
    after it.
    """

    __slots__ = (
        "_connection",
        "_pool",
        "content",
        "content_length",
        "headers",
        "reason",
        "status",
    )

    def __init__(
        self, pool: Pool, connection: _Connection, head: Head, content: BodyStream
    ) -> None:
        self.status = head.status
        self.reason = head.reason
        self.headers: CIMultiDictProxy[str] = head.headers
        # The body's declared length, which a streamed relay keeps.
        self.content_length = head.length if head.framing is Framing.LENGTH else None
        self.content = content
        self._pool = pool
        self._connection: _Connection | None = connection
        content.on_eof(self.release)

    @property
    def content_type(self) -> str:
        """The media type, lower-cased, without parameters (RFC 9110 §8.3.1's default)."""
        value = self.headers.get("Content-Type")
        if not value:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    def release(self) -> None:
        """Give the connection back: kept when the whole answer came, else closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=connection.reusable())

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=False)
