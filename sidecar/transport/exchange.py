"""The one seam to the tool: one attempt at a time, and the answer it brings back.

Foreign exceptions (the connection's, the parser's, asyncio's timeouts) are translated
here and nowhere else: into ``NoAnswer`` while an attempt is judged, into ``BodyBroken``
while an answer's body streams on to the agent. The sidecar's own bugs (``SidecarBug``)
are not translated: they are no fault of the tool's.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.outcomes import AttemptError, NoAnswer, out_of_descriptors
from sidecar.tool.envelopes import json_document
from sidecar.tool.eventstream import AnswerReader
from sidecar.transport.answer import MalformedAnswer
from sidecar.transport.connection import ConnectionBroken, Progress, RequestBody, Stage
from sidecar.transport.pool import Pool, Response
from sidecar.wire.body import BodyStream, read_deadline
from sidecar.wire.buffers import hold


def create_pool(max_connections: int, max_head_bytes: int) -> Pool:
    """The process-wide pool of connections to the tools (0: no limit)."""
    return Pool(max_connections, max_head_bytes)


def _no_answer(progress: Progress, exc: BaseException | None) -> NoAnswer:
    """How an attempt that failed (``None``: the per-try timeout) at ``progress`` ended."""
    if out_of_descriptors(exc):
        return _NO_FDS
    if progress.stage is Stage.QUEUED:
        return _POOL_TIMEOUT
    if progress.stage is Stage.SENT:
        return _TIMEOUT if exc is None else _RESET
    return _CONNECT_TIMEOUT if exc is None else _CONNECT


# Made once: an attempt that failed is common under faults, and these carry no reason.
_NO_FDS = NoAnswer(AttemptError.NO_FDS)
_POOL_TIMEOUT = NoAnswer(AttemptError.POOL_TIMEOUT)
_TIMEOUT = NoAnswer(AttemptError.TIMEOUT)
_RESET = NoAnswer(AttemptError.RESET)
_CONNECT_TIMEOUT = NoAnswer(AttemptError.CONNECT_TIMEOUT)
_CONNECT = NoAnswer(AttemptError.CONNECT)


def _malformed(exc: MalformedAnswer) -> NoAnswer:
    return NoAnswer(AttemptError.MALFORMED, str(exc))


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """One call as it goes to the tool; replayed unchanged by retries."""

    method: str
    url: URL
    headers: CIMultiDict[str]
    body: RequestBody
    # A JSON-RPC request's id as JSON text: the id its answer carries in an event stream.
    rpc_id: bytes | None = None
    # The ``Host`` the tool gets: the agent's, as Envoy keeps it; ``None`` names the
    # upstream's own address (a route's ``host_rewrite``, or an agent that sent none).
    host: str | None = None

    def with_headers(self, headers: CIMultiDict[str]) -> UpstreamRequest:
        """The same call with ``headers`` (an attempt's trace context added)."""
        return UpstreamRequest(self.method, self.url, headers, self.body, self.rpc_id, self.host)


class BodyBroken(Exception):
    """The tool's answer broke off, or turned malformed, while its body streamed on."""


@dataclass(slots=True)
class Answer:
    """The tool's answer: its body whole when ``complete``, else the part read so far.

    ``decisive`` says whether what was read holds what a decision needs: the whole body, or
    for an event stream the event that answers the call (its data in ``event``; ``body``
    holds every byte read up to its end, for the agent). ``slow`` says that part did not
    come within the inspection window, ``live`` that the server sent the agent something
    else first (a notification, a request to the client): either way the answer goes to
    the agent as it is, now.

    An event stream answering a call keeps its ``reader``, which the relay goes on
    feeding. One that broke after an event with an id (MCP's resumable streams) is
    ``broken``: ``body`` ends after its last whole event and nothing follows, so that the
    agent's client can resume it; once the sidecar resumed it itself (``resumed``), the rest
    comes from ``stream``, the resumed ``GET``'s answer.
    """

    response: Response
    body: bytes
    complete: bool
    decisive: bool = False
    slow: bool = False
    event: bytes | None = None
    live: bool = False
    reader: AnswerReader | None = None
    broken: bool = False
    stream: Response | None = None
    resumed: bool = False

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.response.headers

    def discard(self) -> None:
        """Give the connections back to the pool; each is closed if its body was not read."""
        self.response.release()
        if self.stream is not None:
            self.stream.release()

    def judged(self) -> tuple[bytes, str | None]:
        """What a decision reads, and its content coding: the event that answered the call
        (an event stream is read only when it is not encoded), or the body."""
        if self.event is not None:
            return self.event, None
        return self.body, self.response.headers.get("Content-Encoding")

    def document(self) -> Any:
        """The JSON document of the body (or of the event that answered the call), when it
        was read and holds one."""
        if not self.decisive:
            return None
        return json_document(*self.judged())

    def rest(self) -> AnswerRest:
        """The body past ``body``, as it arrives; ``BodyBroken`` if it does not end whole.
        A ``broken`` stream has none."""
        if self.broken:
            return AnswerRest(None)
        return AnswerRest((self.stream or self.response).content)


class AnswerRest:
    """An answer's body as it arrives, its breaks translated (an iterator class, not an
    async generator, so that mypyc compiles it)."""

    def __init__(self, content: BodyStream | None) -> None:
        self._content = content  # None: nothing more comes

    def __aiter__(self) -> AnswerRest:
        return self

    async def __anext__(self) -> bytes:
        if self._content is None:
            raise StopAsyncIteration
        try:
            chunk = await self._content.readany()
        except (ConnectionBroken, MalformedAnswer, OSError) as exc:
            raise BodyBroken(str(exc)) from exc
        if not chunk:
            raise StopAsyncIteration
        return chunk


class BodyRead(enum.Enum):
    """How much of an answer is read before deciding on it."""

    NONE = "none"  # relay as it comes
    WHOLE = "whole"  # small enough to hold: read it all (the rest streams if it is not)
    ANSWER_EVENT = "answer_event"  # an event stream answering a call: up to its answer


def body_read(method: str, response: Response) -> BodyRead:
    """How much of the body can change what happens next.

    Error answers always can; a 2xx only through a JSON envelope (``success: false``) or,
    for an MCP call answered as an event stream, through the event that answers it.
    Long-lived streams (``GET``), encoded event streams, bodiless answers and other media
    go straight to the agent.
    """
    status = response.status
    if method == "HEAD" or status in (204, 304) or status < 200:
        return BodyRead.NONE
    content_type = response.content_type
    if content_type == "text/event-stream":
        encoded = response.headers.get("Content-Encoding", "identity").lower() != "identity"
        return BodyRead.ANSWER_EVENT if method == "POST" and not encoded else BodyRead.NONE
    if status >= 400 or content_type == "application/json" or content_type.endswith("+json"):
        return BodyRead.WHOLE
    return BodyRead.NONE


async def send(pool: Pool, request: UpstreamRequest, timeout_s: float) -> Response | NoAnswer:
    """The first half of an attempt: the request sent and its answer's head received,
    within ``timeout_s``. Cancelled, it closes its connection."""
    progress = Progress()
    try:
        return await pool.request(
            request.method,
            request.url,
            request.headers,
            request.body,
            progress,
            timeout_s,
            host=request.host,
        )
    except TimeoutError:
        return _no_answer(progress, None)
    except MalformedAnswer as malformed:
        return _malformed(malformed)
    except (ConnectionBroken, OSError) as broken:
        return _no_answer(progress, broken)


async def read_for_decision(
    request: UpstreamRequest, response: Response, limit: int, timeout_s: float
) -> Answer | NoAnswer:
    """The answer to ``request`` with as much of its body read as deciding on it needs.

    A body that does not come in time goes to the agent as it is (the status alone
    decides), and so does an event stream whose answer is not within ``limit`` bytes, or
    that shows the call alive (an event other than the answer) before its answer. One
    that breaks is no answer at all: the attempt was delivered and then reset, and the
    replay rules for a delivered request apply; an event stream that broke after an event
    with an id is ``broken``, for ``resume``.
    """
    mode = body_read(request.method, response)
    if mode is BodyRead.NONE:
        return Answer(response, b"", complete=False)
    if mode is BodyRead.ANSWER_EVENT:
        reader = AnswerReader(request.rpc_id, limit)
        return await _read_answer_event(response, response, reader, bytearray(), timeout_s)
    buffer = bytearray()
    try:
        async with read_deadline(response.content, timeout_s):
            complete = await _read_up_to(response, limit, buffer)
            # Past the memory budget the answer is not held to be judged: it goes to the
            # agent as it is.
            complete = complete and hold(len(buffer))
            return Answer(response, bytes(buffer), complete, decisive=complete)
    except TimeoutError:
        return Answer(response, bytes(buffer), complete=False, slow=True)
    except MalformedAnswer as exc:
        response.close()
        return _malformed(exc)
    except (ConnectionBroken, OSError):
        response.close()
        return _RESET
    except asyncio.CancelledError:
        # The agent went away mid-read: the half-read answer must not keep its socket.
        response.close()
        raise


async def resume(
    pool: Pool,
    request: UpstreamRequest,
    cut: Answer,
    limit: int,
    timeouts: tuple[float, float],
) -> Answer | NoAnswer:
    """The rest of a ``broken`` event stream, asked for as MCP 2025-11-25 lets a client
    ("Resumability"): a ``GET`` with ``Last-Event-ID`` (and the call's session and
    credentials), whose stream the server replays from the event after that id. Read as the
    first one was, from where it broke; ``cut`` itself when the server would not resume
    it (then the agent's client may, with what ``cut`` holds). ``timeouts``: the per-try
    timeout for the ``GET``'s head, the inspection window for what follows.
    """
    per_try_s, inspect_s = timeouts
    assert cut.reader is not None and cut.reader.scanner.last_event_id is not None
    try:
        last_event_id = cut.reader.scanner.last_event_id.decode()
    except UnicodeDecodeError:
        return cut  # no header can carry it back: the agent's client has what was read
    headers = resume_headers(request.headers, last_event_id)
    again = UpstreamRequest("GET", request.url, headers, b"", host=request.host)
    sent = await send(pool, again, per_try_s)
    if isinstance(sent, NoAnswer):
        return cut
    if sent.status != 200 or body_read("POST", sent) is not BodyRead.ANSWER_EVENT:
        sent.close()
        return cut
    # What was read goes to the agent up to the last whole event: the server replays what
    # follows it. One resumption per attempt: a second break passes on what was read.
    reader = AnswerReader(request.rpc_id, limit - len(cut.body))
    answer = await _read_answer_event(cut.response, sent, reader, bytearray(cut.body), inspect_s)
    if isinstance(answer, Answer):
        answer.resumed = True
    return answer


# What a resumed stream's GET leaves out of the call's headers: those of its body.
_NOT_RESUMED = frozenset({"content-length", "content-type", "content-encoding"})


def resume_headers(headers: CIMultiDict[str], last_event_id: str) -> CIMultiDict[str]:
    """The call's headers (its session, protocol version, credentials, request id) for the
    ``GET`` that resumes its stream after ``last_event_id``."""
    kept: CIMultiDict[str] = CIMultiDict(
        (name, value) for name, value in headers.items() if name.lower() not in _NOT_RESUMED
    )
    kept["Accept"] = "text/event-stream"
    kept["Last-Event-ID"] = last_event_id
    return kept


async def _read_answer_event(
    head: Response, stream: Response, reader: AnswerReader, buffer: bytearray, timeout_s: float
) -> Answer | NoAnswer:
    """``stream``'s event stream read into ``buffer`` until the event that answers the call,
    one that shows it alive, ``reader``'s limit, or ``timeout_s``; the answer under
    ``head`` (the same response, but for a resumed stream)."""
    resumed = stream is not head
    try:
        async with read_deadline(stream.content, timeout_s):
            while not reader.exhausted and not reader.alive:
                chunk = await stream.content.readany()
                if not chunk:
                    break
                buffer.extend(chunk)
                event = reader.feed(chunk)
                if event is not None:
                    return _streamed(head, stream, buffer, reader, decisive=True, event=event)
            return _streamed(head, stream, buffer, reader, live=reader.alive)
    except TimeoutError:
        return _streamed(head, stream, buffer, reader, slow=True)
    except MalformedAnswer as exc:
        stream.close()
        return _malformed(exc)
    except (ConnectionBroken, OSError):
        stream.close()
        if reader.scanner.last_event_id is None and not resumed:
            return _RESET
        whole = bytes(buffer[: len(buffer) - (reader.scanner.fed - reader.scanner.boundary)])
        return Answer(head, whole, complete=False, reader=reader, broken=True, resumed=resumed)
    except asyncio.CancelledError:
        stream.close()
        raise


def _streamed(
    head: Response, stream: Response, buffer: bytearray, reader: AnswerReader, **read: Any
) -> Answer:
    """An event stream's answer as read so far."""
    more = stream if stream is not head else None
    return Answer(head, bytes(buffer), complete=False, reader=reader, stream=more, **read)


async def _read_up_to(response: Response, limit: int, buffer: bytearray) -> bool:
    """Read about ``limit`` bytes of the body at most into ``buffer``; whether that is all."""
    declared = response.content_length
    if declared is not None and declared > limit:
        return False
    while len(buffer) <= limit:
        chunk = await response.content.readany()
        if not chunk:
            return True
        buffer.extend(chunk)
    return False
