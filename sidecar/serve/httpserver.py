"""The agent-facing HTTP/1.1 server: an asyncio protocol around llhttp (``httptools``).

aiohttp's own server builds a request object, a payload stream, a writer and a task for
every request, and its response classes prepare headers through several layers: 167,000
instructions a request for a bare answer, where this protocol needs about a third. What
it keeps of aiohttp's server, each pinned by the wire tests: llhttp's strict parse (a
``Transfer-Encoding`` with a ``Content-Length``, any coding but a final ``chunked``,
duplicate lengths, bad tokens and bare LFs are refused); the head limits (414 for the
request line, 431 for a header line or a head that never ends); the client timeout for a
head, on a new connection and between requests; keep-alive and pipelining, answered in
order; a body streamed with backpressure; a handler cancelled when its agent goes away;
a short linger for an unread body; and a drain (``AgentServer.close``) that lets the
answers under way finish.

Every answer of its own carries the envelope and the ``X-Sidecar-*`` report, never the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import httptools
from aiohttp import HttpVersion, HttpVersion10, HttpVersion11

from sidecar.serve import answers
from sidecar.serve.agentwire import (
    AgentReply,
    AgentRequest,
    AnswerWriter,
    BodyMalformed,
    answer_head,
)
from sidecar.serve.routing import target_fault
from sidecar.wire.buffers import BufferBudget
from sidecar.wire.headers import undeliverable_header

# Pipelined requests parsed ahead of the one being answered before reading pauses.
_PIPELINE_LIMIT = 16
_VERSIONS = {"1.1": HttpVersion11, "1.0": HttpVersion10}


class _RefusedHead(Exception):
    """A head over a limit, raised inside the parser's callback."""


class Serving(Protocol):
    """What a connection reads of the server that accepted it (``AgentServer``)."""

    client_timeout_s: float  # for a head, on a new connection and between requests
    max_header_bytes: int  # the whole header section's
    max_line_size: int
    max_field_size: int
    lingering_s: float  # for the rest of a body the answer did not need
    logger: logging.Logger
    buffers: BufferBudget
    agents: set[AgentConnection]  # the connections open
    handler: Callable[[AgentRequest], Awaitable[AgentReply]]  # what answers each request


class AgentConnection(AnswerWriter):
    """One agent's connection: its requests parsed as they arrive, answered in order."""

    def __init__(self, server: Serving) -> None:
        super().__init__()
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._remote: str | None = None
        self._pending: deque[AgentRequest] = deque()  # heads taken on, not yet answered
        self._fresh: list[AgentRequest] = []  # heads completed in this read
        self._current: AgentRequest | None = None  # the request whose body is arriving
        self._url = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._in_head = False
        self._head_bytes = 0
        self._head_held = 0  # of the buffer budget: a head arriving in more than one read
        self._refusal: answers.Refusal | None = None
        self._closing = False  # no request after those pending
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._idle_deadline: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._paused_for = {"body": False, "pipeline": False, "parser": False}
        # The framing of an upgrade request's body, for the parser that reads the body.
        self._resumed_head: bytes | None = None

    # -- the transport's side -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are ones.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) else None
        self._server.agents.add(self)
        self._arm_idle()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        self._server.agents.discard(self)
        self._release_head()
        # Freed now, with the budget, not when the collector breaks the parser's cycle.
        self._parser = httptools.HttpRequestParser(self)
        self._headers, self._url = [], bytearray()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._current is not None:
            self._current.content.abandon(ConnectionResetError("Connection lost"))
        self.writer_lost()
        # The agent is gone: nothing it asked for continues on its behalf.
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._paused_for["parser"]:
            return
        self._feed(data)
        self._release()

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self._resumed_head is None:
                # CONNECT, or an upgrade without a body: what follows may not be HTTP;
                # answer, then close.
                self._stop_reading()
                return
            # llhttp stops at an upgrade's body; the sidecar does not upgrade (the headers
            # are hop-by-hop and dropped), so the body is read as an ordinary request's,
            # by a parser that starts from a head holding only the body's framing.
            self._parser = httptools.HttpRequestParser(self)
            self._feed(self._resumed_head + data[upgrade.args[0] :])
        except httptools.HttpParserCallbackError:
            self._refuse_head()
        except httptools.HttpParserError as exc:
            self._malformed(str(exc))
        else:
            if self._in_head:
                self._head_bytes += len(data)
                if self._head_bytes > self._head_limit():
                    self._refusal = answers.Refusal(
                        answers.HEADERS_TOO_LARGE,
                        "the request's head is larger than the sidecar accepts",
                    )
                    self._refuse_head()
                elif not self._server.buffers.take(len(data)):
                    self._refusal = answers.buffers_full()
                    self._refuse_head()
                else:
                    self._head_held += len(data)

    # -- the parser's callbacks ------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = bytearray()
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._server.max_line_size:
            self._refusal = answers.head_too_large(answers.URI_TOO_LONG)
            raise _RefusedHead

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 2 > self._server.max_field_size:
            self._refusal = answers.head_too_large(answers.HEADERS_TOO_LARGE)
            raise _RefusedHead
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._resumed_head is not None:  # the framing head of an upgrade's body
            self._resumed_head = None
            return
        if self._head_held:  # a head that came in one read was never charged
            self._release_head()
        self._idle_deadline = None
        parser = self._parser
        version = parser.get_http_version()
        request = AgentRequest(
            self,
            parser.get_method().decode("ascii"),
            self._url.decode("utf-8", "surrogateescape"),
            _VERSIONS.get(version) or HttpVersion(*map(int, version.split("."))),
            self._headers,
            keep_alive=parser.should_keep_alive(),
            remote=self._remote,
        )
        self._current = request
        self._fresh.append(request)

    def on_body(self, body: bytes) -> None:
        assert self._current is not None
        self._current.content.feed(body)

    def on_message_complete(self) -> None:
        if self._parser.should_upgrade() and self._current is not None:
            self._resumed_head = upgrade_body_head(self._current)
            if self._resumed_head is not None:
                return  # the body llhttp skipped is still to come
        if self._current is not None:
            self._current.content.feed_eof()
            self._current = None

    # -- what was parsed -------------------------------------------------------------

    def _release_head(self) -> None:
        """The head's bytes leave the budget: parsed, or their connection gone."""
        self._server.buffers.give(self._head_held)
        self._head_held = 0

    def _head_limit(self) -> int:
        """Head bytes that no head within the limits reaches: reading stops there."""
        return 2 * (self._server.max_line_size + self._server.max_field_size)

    def _refuse_head(self) -> None:
        refusal = self._refusal or answers.head_too_large(answers.HEADERS_TOO_LARGE)
        self._malformed(refusal.message, refusal)

    def _malformed(self, reason: str, refusal: answers.Refusal | None = None) -> None:
        """The parse broke: a request whose body was being read gets a broken body (the
        proxy answers 400); otherwise the connection's last answer is the refusal."""
        current = self._current
        self._stop_reading()
        if current is not None and current not in self._fresh and refusal is None:
            current.content.set_exception(BodyMalformed(message=reason))
            return
        if current is not None and current in self._fresh:
            self._fresh.remove(current)  # never taken on: refused with its head
        self._current = None
        self._refusal = refusal or answers.Refusal(
            answers.BAD_REQUEST, "the request is not valid HTTP/1.1"
        )
        self._server.logger.info("malformed_request", extra={"reason": reason})

    def _stop_reading(self) -> None:
        self._closing = True
        self._paused_for["parser"] = True
        self._sync_reading()

    def _release(self) -> None:
        """Heads completed in this read go to the loop that answers them, in order."""
        if self._fresh:
            self._pending.extend(self._fresh)
            self._fresh.clear()
            self._paused_for["pipeline"] = len(self._pending) > _PIPELINE_LIMIT
            self._sync_reading()
        if self._pending or self._refusal is not None:
            if self._task is None:
                self._task = self._loop.create_task(self._serve())
            elif self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    def pause_reading(self) -> None:
        self._paused_for["body"] = True
        self._sync_reading()

    def resume_reading(self) -> None:
        if self._paused_for["body"]:
            self._paused_for["body"] = False
            self._sync_reading()

    def _sync_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if any(self._paused_for.values()):
            if transport.is_reading():
                transport.pause_reading()
        elif not transport.is_reading():
            transport.resume_reading()

    # -- answering -------------------------------------------------------------------

    async def _serve(self) -> None:
        """Answer the requests taken on, in order, until the connection is done."""
        try:
            while await self._next():
                request = self._pending.popleft()
                self.answer_started = False
                if self._paused_for["pipeline"] and len(self._pending) <= _PIPELINE_LIMIT:
                    self._paused_for["pipeline"] = False
                    self._sync_reading()
                reply = await self._answer(request)
                if not await self._finish(request, reply):
                    break
            if self._refusal is not None and self._transport is not None:
                await self._send_whole(HttpVersion10, "GET", _refused(self._refusal), False)
        except ConnectionError:
            pass
        finally:
            self._task = None
            if self._transport is not None:
                self._transport.close()

    async def _next(self) -> bool:
        """Whether a request waits to be answered, waiting for one while the connection
        may still bring one."""
        while not self._pending:
            if self._closing or self._transport is None:
                return False
            self._arm_idle()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            if self._refusal is not None and not self._pending:
                return False
        return True

    async def _answer(self, request: AgentRequest) -> AgentReply:
        try:
            refused = await _taken_on(request, self._server.max_header_bytes)
            if refused is not None:
                return refused
            return await self._server.handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._server.logger.exception("Error handling request")
            if self.answer_started:
                # Half an answer went out: only a cut connection can say it is not whole.
                self.abort()
                return AgentReply(500, sent=True)
            return _refused(
                answers.Refusal(answers.SIDECAR_ERROR, "the sidecar failed to handle the request")
            )

    async def _finish(self, request: AgentRequest, reply: AgentReply) -> bool:
        """Send ``reply`` unless the relay streamed it; whether the connection goes on."""
        if not reply.sent:
            await self._send_whole(request.version, request.method, reply, request.keep_alive)
        if not reply.keep_alive or self._transport is None:
            return False
        if request.content.at_eof():
            return True
        # Read what is left of an unread body for a while, so that an agent still sending
        # sees the answer rather than a reset; the connection goes on only if it all came.
        try:
            async with asyncio.timeout(self._server.lingering_s):
                while await request.content.readany():
                    pass
        except (TimeoutError, BodyMalformed, ConnectionError):
            return False
        return True

    async def _send_whole(
        self, version: HttpVersion, method: str, reply: AgentReply, keep_alive: bool
    ) -> None:
        framing = reply.framing(method, version, keep_alive)
        head = answer_head(version, reply)
        await self.write(head + reply.body if framing != "none" else head)

    # -- time and shutdown -----------------------------------------------------------

    def _arm_idle(self) -> None:
        """A head must arrive within the client timeout, on a new connection or between
        requests; the timer is set once and moved on by the deadline it finds."""
        self._idle_deadline = self._loop.time() + self._server.client_timeout_s
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_at(self._idle_deadline, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        deadline = self._idle_deadline
        if deadline is None or self._transport is None:
            return
        if self._loop.time() < deadline:
            self._idle_timer = self._loop.call_at(deadline, self._idle_check)
            return
        self._transport.close()

    def close_when_idle(self) -> None:
        """No more requests: an idle connection closes now, a busy one after its answer."""
        self._closing = True
        if self._waiter is not None and self._transport is not None:
            self._transport.close()

    async def shutdown(self, grace_s: float | None) -> None:
        """Let the request being answered finish within ``grace_s``, then cut it (and give
        its handler as long again to end)."""
        self._closing = True
        task = self._task
        if task is not None and not task.done():
            _, running = await asyncio.wait({task}, timeout=grace_s)
            if running:
                task.cancel()
                await asyncio.wait({task}, timeout=grace_s)
        if self._transport is not None:
            self._transport.close()


def upgrade_body_head(request: AgentRequest) -> bytes | None:
    """For a request llhttp took as an upgrade, a head holding only its body's framing
    fields, as the agent sent them (``None`` for CONNECT or a request without a body)."""
    if request.method == "CONNECT" or not request.body_exists:
        return None
    names = (b"content-length", b"transfer-encoding")
    framing = b"".join(
        b"%s: %s\r\n" % field for field in request.raw_headers if field[0].lower() in names
    )
    version = request.version
    return b"POST / HTTP/%d.%d\r\n%s\r\n" % (version.major, version.minor, framing)


def _refused(refusal: answers.Refusal) -> AgentReply:
    reply = refusal.response(answers.refusal_report(refusal.error))
    reply.force_close()
    return reply


async def _taken_on(request: AgentRequest, max_header_bytes: int) -> AgentReply | None:
    """The refusal of a head that cannot go to any tool as it is; else ``None``, an agent
    that expects ``100-continue`` told to send its body."""
    try:
        check_head(request, max_header_bytes)
        if request.headers.get("Expect"):
            await _continue(request)
    except answers.Refusal as refusal:
        # What else the agent sent on this connection cannot be trusted to be framed as
        # it thinks.
        refused = refusal.response(answers.own_report(refusal.error))
        refused.force_close()
        return refused
    return None


def check_head(request: AgentRequest, max_header_bytes: int) -> None:
    """Refuse a request that cannot go to any tool as it is.

    A target the tool could resolve out of its route (``routing.target_fault``), an
    HTTP/1.1 request without ``Host`` (RFC 9112 §3.2); header bytes that are not UTF-8 could not
    be passed on as they came; a header section over the limit is refused as a whole,
    where aiohttp's own limits hold each line.
    """
    refused = target_fault(request.raw_path)
    if refused is not None:
        raise answers.Refusal(answers.BAD_REQUEST, refused)
    hosts = request.headers.getall("Host", ())
    if request.version == HttpVersion11 and not hosts:
        raise answers.Refusal(answers.BAD_REQUEST, "an HTTP/1.1 request without Host")
    if len(hosts) > 1:
        # RFC 9112 §3.2: which one the tool would read is not the sidecar's to guess.
        raise answers.Refusal(answers.BAD_REQUEST, "a request with more than one Host")
    bad_header = undeliverable_header(request.headers)
    if bad_header is not None:
        raise answers.Refusal(answers.BAD_REQUEST, f"header {bad_header} is not valid UTF-8")
    if sum(len(name) + len(value) + 4 for name, value in request.raw_headers) > max_header_bytes:
        raise answers.Refusal(
            answers.HEADERS_TOO_LARGE,
            "the request's header section is larger than the sidecar accepts",
            {"limit_bytes": max_header_bytes},
        )


async def _continue(request: AgentRequest) -> None:
    """What aiohttp's application router does for ``Expect`` before its handler runs: an
    HTTP/1.1 agent expecting ``100-continue`` is told to send its body; any other
    expectation cannot be met (417)."""
    expect = request.headers["Expect"]
    if request.version != HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise answers.Refusal(answers.EXPECTATION_FAILED, f"unknown expectation: {expect}")
    await request.send_continue()
