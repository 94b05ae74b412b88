"""A pooled HTTP/1.1 client to the tools: asyncio protocols and aiohttp's llhttp parser.

aiohttp's ``ClientSession`` builds a request and a response object model per call,
resolves and caches names, arms its own timers and hands connections through a general
connector; under load that was ~29% of the sidecar's CPU. A proxy needs less: write the
head the agent's request already holds, parse the answer's head with the same C parser,
and pass the body on through the ``StreamReader`` that parser fills.

The pool never resends a request by itself: a kept-alive connection that drops under a
request is that attempt's failure, for the caller's replay rules to judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ssl
import time
from collections import deque
from collections.abc import AsyncIterable
from dataclasses import dataclass

from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_parser import HttpResponseParser, RawResponseMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

RequestBody = bytes | AsyncIterable[bytes]

# The parser's buffer size: past twice this much unread body the socket stops being read.
_READ_LIMIT = 2**16
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
    """The tool's connection closed, or carried something that is not an HTTP answer."""


class Pool:
    """Connections to the tools, at most ``limit`` in use at once (0: no limit)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
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
        head (``TimeoutError``); ``progress`` tells how far the request got.
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
        try:
            message, payload = await connection.exchange(
                method, _head(method, url, headers, body), body, progress, deadline
            )
        except BaseException:
            self.release(connection, reuse=False)
            raise
        return Response(self, connection, message, payload)

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
            lambda: _Connection(loop, self, key),
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


def _head(method: str, url: URL, headers: CIMultiDict[str], body: RequestBody) -> bytes:
    """The request line and header block; the body's framing follows from its kind."""
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            # It would end the field early and start a header (or a request) of its own.
            raise ValueError(f"header {name} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    if isinstance(body, bytes):
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    else:
        lines.append("Transfer-Encoding: chunked\r\n\r\n")
    return "".join(lines).encode("utf-8")


class _Connection(BaseProtocol):
    """One socket to a tool, carrying one request at a time."""

    __slots__ = (
        "_head_waiter",
        "_parser_with_body",
        "_payload",
        "_pool",
        "_should_close",
        "_writer",
        "idle_since",
        "key",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: Pool, key: _PoolKey) -> None:
        super().__init__(loop)
        self._pool = pool
        self.key = key
        self.idle_since = 0.0
        self._head_waiter: asyncio.Future[tuple[RawResponseMessage, StreamReader]] | None = None
        self._parser_with_body = True
        self._payload: StreamReader | None = None
        self._writer: asyncio.Task[None] | None = None
        self._should_close = False

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

    def reusable(self, payload: StreamReader) -> bool:
        """Whether the next request may follow on this connection once ``payload`` ends."""
        return (
            not self._should_close
            and self.transport is not None
            and payload.is_eof()
            and payload.exception() is None
            and (self._writer is None or self._writer.done())
        )

    async def exchange(
        self,
        method: str,
        head: bytes,
        body: RequestBody,
        progress: Progress,
        deadline: float,
    ) -> tuple[RawResponseMessage, StreamReader]:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionBroken("the connection closed before the request was sent")
        with_body = method != "HEAD"
        if self._parser is None or self._parser_with_body is not with_body:
            # One parser serves every answer on the connection: each request reaches here
            # only after the answer before it was parsed to its end. Building one costs
            # ~2.5% of the CPU per request.
            self._parser = HttpResponseParser(
                self,
                self._loop,
                _READ_LIMIT,
                payload_exception=ConnectionBroken,
                response_with_body=with_body,
                read_until_eof=True,
                auto_decompress=False,
            )
            self._parser_with_body = with_body
        waiter: asyncio.Future[tuple[RawResponseMessage, StreamReader]]
        waiter = self._head_waiter = self._loop.create_future()
        self._payload = None
        self._writer = None
        if isinstance(body, bytes):
            transport.write(head + body if body else head)
        else:
            transport.write(head)
            self._writer = self._loop.create_task(self._write_chunks(body))
        progress.stage = Stage.SENT
        timer = self._loop.call_at(deadline, _time_out, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def _write_chunks(self, body: AsyncIterable[bytes]) -> None:
        try:
            async for chunk in body:
                transport = self.transport
                if transport is None:
                    return
                if chunk:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                    await self._drain_helper()
            if self.transport is not None:
                self.transport.write(b"0\r\n\r\n")
        except Exception as exc:
            self._break(ConnectionBroken(f"the request body failed: {exc!r}"))

    def _break(self, exc: ConnectionBroken) -> None:
        """This connection cannot carry its request on: fail whoever waits for its answer."""
        self._should_close = True
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
            self.close()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or self._head_waiter is None:
            if data:
                self.close()  # bytes nobody asked for: this connection is out of step
            return
        try:
            messages, _, _ = parser.feed_data(data)
        except Exception as exc:
            self._break(ConnectionBroken(f"not an HTTP answer: {exc!r}"))
            self._cut_body(ConnectionBroken(f"the body broke: {exc!r}"))
            self.close()
            return
        for message, payload in messages:
            if 100 <= message.code < 200 and message.code != 101:
                continue  # an interim answer; the final one follows
            waiter = self._head_waiter
            if waiter is None or waiter.done():
                self.close()  # a second answer to one request
                return
            if message.should_close or message.code == 101:
                self._should_close = True
            self._payload = payload
            waiter.set_result((message, payload))

    def _cut_body(self, exc: ConnectionBroken) -> None:
        """The answer's body ends here without its end: readers get ``exc``, not an EOF."""
        payload = self._payload
        if payload is not None and not payload.is_eof() and payload.exception() is None:
            payload.set_exception(exc)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._should_close = True
        parser, self._parser = self._parser, None
        waiter = self._head_waiter
        broken = ConnectionBroken(f"the tool closed the connection ({exc!r})")
        if waiter is not None and not waiter.done():
            waiter.set_exception(broken)
        elif parser is not None:
            with contextlib.suppress(Exception):
                parser.feed_eof()  # ends a body that runs until the connection's end
            self._cut_body(broken)  # any other body is cut short
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
        self._pool.forget(self)
        super().connection_lost(exc)

    def close(self) -> None:
        self._should_close = True
        transport = self.transport
        if transport is not None:
            transport.close()
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()


def _time_out(waiter: asyncio.Future[tuple[RawResponseMessage, StreamReader]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Response:
    """An answer's status and headers; its body streams from ``content``.

    The connection returns to the pool when the body has been read to its end, or goes
    with ``release``/``close``; it is reused only when the whole answer came.
    """

    __slots__ = ("_connection", "_pool", "content", "headers", "reason", "status")

    def __init__(
        self,
        pool: Pool,
        connection: _Connection,
        message: RawResponseMessage,
        payload: StreamReader,
    ) -> None:
        self.status = message.code
        self.reason = message.reason
        self.headers: CIMultiDictProxy[str] = message.headers
        self.content = payload
        self._pool = pool
        self._connection: _Connection | None = connection
        if payload is EMPTY_PAYLOAD or payload.is_eof():
            self.release()
        else:
            payload.on_eof(self.release)

    @property
    def content_type(self) -> str:
        """The media type, lower-cased, without parameters (RFC 9110 §8.3.1's default)."""
        value = self.headers.get("Content-Type")
        if not value:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def release(self) -> None:
        """Give the connection back: kept when the whole answer came, else closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=connection.reusable(self.content))

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=False)
