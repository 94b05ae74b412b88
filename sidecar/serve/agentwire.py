"""An agent's request as the proxy reads it, and an answer as it goes back on the wire.

``AgentRequest`` is what the agent-facing server (``httpserver``) parsed: the head as
sent, and the body as a stream that arrives behind it. ``AgentReply`` is an answer the proxy
returns, whole, or already streamed by the relay; ``answer_head`` writes the status line
and headers with exactly the headers given plus what HTTP itself requires: the framing,
``Date`` when absent (RFC 9110 §6.6.1 asks it of a proxy) and ``Connection`` when the
connection's fate differs from the version's default. No ``Server`` and no default
``Content-Type``: a relayed answer carries nothing the tool did not send.
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp import HttpVersion, HttpVersion10, HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.wire.body import BodyStream

# Statuses whose answers never have a body, besides the 1xx (RFC 9110 §15.3.5, §15.4.5).
_BODILESS_STATUS = frozenset({204, 304})
_REASONS = {status.value: status.phrase for status in HTTPStatus}
# Body bytes buffered before the agent's connection stops being read.
BODY_HIGH_WATER = 256 * 1024


class BodyMalformed(HttpProcessingError):
    """The agent's body framing broke (a bad chunk) after the head was taken on."""


class AgentRequest:
    """One request as the agent sent it: method, target and headers, and its body."""

    __slots__ = (
        "_connection",
        "body_exists",
        "content",
        "content_length",
        "headers",
        "keep_alive",
        "method",
        "raw_headers",
        "raw_path",
        "remote",
        "version",
    )

    scheme = "http"

    def __init__(
        self,
        connection: AnswerWriter,
        method: str,
        raw_path: str,
        version: HttpVersion,
        raw_headers: list[tuple[bytes, bytes]],
        *,
        keep_alive: bool,
        remote: str | None,
    ) -> None:
        self._connection = connection
        self.method = method
        self.raw_path = raw_path
        self.version = version
        self.raw_headers = raw_headers
        self.keep_alive = keep_alive
        self.remote = remote
        self.headers = CIMultiDictProxy(
            CIMultiDict(
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
                for name, value in raw_headers
            )
        )
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None else None
        self.body_exists = bool(self.content_length) or "Transfer-Encoding" in self.headers
        self.content = BodyStream(connection, BODY_HIGH_WATER)
        if not self.body_exists:
            self.content.feed_eof()

    @property
    def path(self) -> str:
        """The target's path, percent-decoded."""
        return URL(self.raw_path, encoded=True).path

    @property
    def raw_path_without_query(self) -> str:
        """The target's path as sent, for the logs (a query may hold credentials)."""
        if self.raw_path.startswith("/"):
            return self.raw_path.partition("?")[0]
        return URL(self.raw_path, encoded=True).raw_path

    async def send_continue(self) -> None:
        """Tell an agent that sent ``Expect: 100-continue`` to send its body."""
        await self._connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def start_answer(self, status: int, reason: str, headers: CIMultiDict[str]) -> AgentReply:
        """Send the head of an answer whose body follows in ``write_body`` calls."""
        reply = AgentReply(status, reason, headers, sent=True)
        framing = reply.framing(self.method, self.version, self.keep_alive)
        await self._connection.start_body(self.version, reply, framing)
        return reply

    async def write_body(self, data: bytes) -> None:
        await self._connection.write_body(data)

    async def end_answer(self) -> None:
        await self._connection.end_body()

    def close_connection(self) -> None:
        """Cut the agent's connection: what it was sent cannot pass for a whole answer."""
        self._connection.abort()


class AnswerWriter(asyncio.Protocol):
    """The agent's connection as a request writes to it: answers go out in order, and a
    writer waits while the transport's buffer is full."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._write_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._framing = "none"
        # Whether the head of the current request's answer has gone out.
        self.answer_started = False

    def pause_reading(self) -> None:
        """Stop reading the agent's socket (a body's unread bytes are past the limit)."""
        raise NotImplementedError

    def resume_reading(self) -> None:
        """Read the agent's socket again."""
        raise NotImplementedError

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._write_waiter is not None and not self._write_waiter.done():
            self._write_waiter.set_result(None)

    def writer_lost(self) -> None:
        if self._write_waiter is not None and not self._write_waiter.done():
            self._write_waiter.set_exception(ConnectionResetError("Connection lost"))

    async def write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        transport.write(data)
        if self._write_paused:
            self._write_waiter = self._loop.create_future()
            try:
                await self._write_waiter
            finally:
                self._write_waiter = None

    async def start_body(self, version: HttpVersion, reply: AgentReply, framing: str) -> None:
        self._framing = framing
        self.answer_started = True
        await self.write(answer_head(version, reply))

    async def write_body(self, data: bytes) -> None:
        if not data or self._framing == "none":
            return
        if self._framing == "chunked":
            data = b"%x\r\n%b\r\n" % (len(data), data)
        await self.write(data)

    async def end_body(self) -> None:
        if self._framing == "chunked":
            await self.write(b"0\r\n\r\n")

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.close()


class AgentReply:
    """An answer for the agent: a whole body, or (``sent``) one the relay streamed."""

    __slots__ = ("body", "headers", "keep_alive", "reason", "sent", "status")

    def __init__(
        self,
        status: int,
        reason: str | None = None,
        headers: CIMultiDict[str] | None = None,
        body: bytes = b"",
        *,
        sent: bool = False,
    ) -> None:
        self.status = status
        self.reason = _REASONS.get(status, "") if reason is None else reason
        self.headers = headers if headers is not None else CIMultiDict()
        self.body = body
        self.sent = sent
        # None: as the request asks (HTTP/1.1 keeps, HTTP/1.0 closes unless asked)
        self.keep_alive: bool | None = None

    def force_close(self) -> None:
        self.keep_alive = False

    def framing(self, method: str, version: HttpVersion, keep_alive: bool) -> str:
        """How the body goes out: ``none``, ``length``, ``chunked`` or ``close``; sets the
        framing headers and ``keep_alive`` to match."""
        headers = self.headers
        status = self.status
        if self.keep_alive is None:
            self.keep_alive = keep_alive
        connected = method == "CONNECT" and 200 <= status < 300
        # A whole body states its length; an empty one to HEAD or in a 304 cannot know it.
        if (
            not self.sent
            and "Content-Length" not in headers
            and (self.body or (status != 304 and method != "HEAD"))
        ):
            headers["Content-Length"] = str(len(self.body))
        if method == "HEAD" or status < 200 or status in _BODILESS_STATUS or connected:
            if status < 200 or status == 204 or connected:
                headers.popall("Content-Length", None)
            headers.popall("Transfer-Encoding", None)
            return "none"
        if "Content-Length" in headers:
            return "length"
        if version == HttpVersion11:
            headers["Transfer-Encoding"] = "chunked"
            return "chunked"
        self.keep_alive = False
        return "close"


def answer_head(version: HttpVersion, reply: AgentReply) -> bytes:
    """The status line and header section of ``reply``, framing headers already set."""
    headers = reply.headers
    if "Date" not in headers:
        headers["Date"] = http_date()
    if "Connection" not in headers:
        if reply.keep_alive and version == HttpVersion10:
            headers["Connection"] = "keep-alive"
        elif not reply.keep_alive and version == HttpVersion11:
            headers["Connection"] = "close"
    lines = [f"HTTP/{version.major}.{version.minor} {reply.status} {reply.reason}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
    lines.append("\r\n")
    return "".join(lines).encode("utf-8")


_date: tuple[int, str] = (0, "")


def http_date() -> str:
    """The current time as an HTTP-date, made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]
