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
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.transport.answer import Framing, Head
from sidecar.transport.connection import (
    Connection,
    ConnectionState,
    PoolKey,
    Progress,
    RequestBody,
    Stage,
)
from sidecar.wire.body import BodyStream

# Opens a connection to a tool: the pool's own dials a socket; a test's hands the
# connection a transport of its own. Given the pool, whose ``forget`` a connection calls.
Opener = Callable[["Pool", PoolKey], Awaitable[Connection]]


class Pool:
    """Connections to the tools, at most ``limit`` in use at once (0: no limit).

    ``max_head_bytes`` bounds an answer's head (status line and header fields).
    """

    def __init__(self, limit: int, max_head_bytes: int, opener: Opener | None = None) -> None:
        self._opener: Opener = opener or Pool._open
        self._limit = limit
        self.max_head_bytes = max_head_bytes
        self._in_use = 0
        self._idle: dict[PoolKey, list[Connection]] = {}
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
        host: str | None = None,
    ) -> Response:
        """Send one request and wait for its answer's head; the body streams after.

        ``timeout_s`` bounds the wait for a connection, connecting, and the wait for the
        head (``TimeoutError``); ``progress`` tells how far the request got. An answer
        that is not valid HTTP/1.1 raises ``MalformedAnswer``. ``host`` is the ``Host``
        sent (``None``: the URL's authority).
        """
        tls = url.scheme == "https"
        key = (tls, url.raw_host or "", url.port or (443 if tls else 80))
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
                _head(url, method, headers, body, chunked, host),
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

    def _take_idle(self, key: PoolKey) -> Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable(now):
                self._in_use += 1
                return connection
            connection.close()
        return None

    async def _acquire(self, key: PoolKey, progress: Progress) -> Connection:
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
            return await self._opener(self, key)
        except BaseException:
            self._in_use -= 1
            self._wake_one()
            raise

    async def _open(self, key: PoolKey) -> Connection:
        """A socket to the tool (TLS for https)."""
        tls, host, port = key
        loop = asyncio.get_running_loop()
        if tls and self._tls is None:
            # Made on the first https connection only: loading the trust store blocks the
            # loop once, and holds memory a sidecar in front of plain-http tools never needs.
            self._tls = _verifying_context()
        _, connection = await loop.create_connection(
            lambda: Connection(key, self.max_head_bytes, self.forget),
            host.strip("[]"),
            port,
            ssl=self._tls if tls else None,
            server_hostname=host if tls else None,
        )
        return connection

    def release(self, connection: Connection, *, reuse: bool) -> None:
        """Take ``connection`` back: kept for the next request, or closed."""
        self._in_use -= 1
        if reuse and not self._closed:
            connection.idle_since = time.monotonic()
            connection.wait_for_request()
            self._idle.setdefault(connection.key, []).append(connection)
        else:
            connection.close()
        self._wake_one()

    def forget(self, connection: Connection) -> None:
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
    url: URL,
    method: str,
    headers: CIMultiDict[str],
    body: RequestBody,
    chunked: bool,
    host: str | None = None,
) -> bytes:
    """The request line and header block, ``Host`` first (RFC 9110 §7.2).

    ``headers`` hold the agent's ``Content-Length``, if it sent one, stating the length of
    ``body``. A buffered body the agent sent chunked gets its length. A request without a
    body gets no framing header.
    """
    if host is None:
        host = url.host_port_subcomponent
    elif "\r" in host or "\n" in host:
        raise ValueError("Host holds a line break")
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {host}\r\n"]
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

    def __init__(self, pool: Pool, connection: Connection, head: Head, content: BodyStream) -> None:
        self.status = head.status
        self.reason = head.reason
        self.headers: CIMultiDictProxy[str] = head.headers
        # The body's declared length, which a streamed relay keeps.
        self.content_length = head.length if head.framing is Framing.LENGTH else None
        self.content = content
        self._pool = pool
        self._connection: Connection | None = connection
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
            self._pool.release(connection, reuse=connection.state is ConnectionState.IDLE)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=False)
