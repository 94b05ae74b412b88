"""An agent's request body taken in: buffered whole when it fits the route's limit (for
replay and repair), else streamed on as it arrives; refused when it is too large, too
slow, malformed, or past the memory budget.

Only a request whose body is in takes a slot of ``SIDECAR_MAX_IN_FLIGHT`` (the proxy
counts it after this module is done), so uploads that trickle in hold no slot another
agent needs; what they hold in memory is charged to the buffer budget here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp.http_exceptions import HttpProcessingError

from sidecar.serve import answers
from sidecar.serve.agentwire import AgentRequest
from sidecar.wire.body import read_deadline
from sidecar.wire.buffers import hold


@dataclass(slots=True)
class StreamedBody:
    """A request body too large to buffer, passed on as it arrives (never replayed)."""

    head: bytes
    request: AgentRequest
    hard_limit: int
    idle_timeout_s: float
    exceeded: bool = False
    stalled: bool = False

    def chunks(self) -> UploadChunks:
        return UploadChunks(self)


class UploadChunks:
    """A streamed body's bytes for the tool: its head, then the rest as it arrives, within
    the hard limit and the client timeout (an iterator class, not an async generator, so
    that mypyc compiles it)."""

    def __init__(self, body: StreamedBody) -> None:
        self._body = body
        self._sent = 0
        self._head_sent = False

    def __aiter__(self) -> UploadChunks:
        return self

    async def __anext__(self) -> bytes:
        body = self._body
        if not self._head_sent:
            self._head_sent = True
            self._sent = len(body.head)
            return body.head
        try:
            async with asyncio.timeout(body.idle_timeout_s):
                chunk = await body.request.content.readany()
        except TimeoutError:
            body.stalled = True
            raise client_too_slow() from None
        if not chunk:
            raise StopAsyncIteration
        self._sent += len(chunk)
        if body.hard_limit and self._sent > body.hard_limit:
            body.exceeded = True
            raise answers.RequestTooLarge
        return chunk


@dataclass(frozen=True, slots=True)
class BodyIntake:
    """The process's limits on request bodies."""

    max_request_bytes: int
    client_timeout_s: float

    def too_large(self) -> answers.Refusal:
        return answers.Refusal(
            answers.REQUEST_TOO_LARGE,
            "request body is larger than the sidecar accepts",
            {"limit_bytes": self.max_request_bytes},
        )

    async def read(self, request: AgentRequest, buffer_limit: int) -> bytes | StreamedBody:
        """The body buffered when it fits ``buffer_limit``, else a stream.

        A body over the hard limit, one the agent garbles (a bad chunk) or cuts short, one
        that stops arriving, and one the memory budget has no room for are refused here,
        not left to surface as a server error.
        """
        declared = request.content_length
        if declared is not None and self.max_request_bytes and declared > self.max_request_bytes:
            raise self.too_large()
        if not request.body_exists:
            return b""
        try:
            async with read_deadline(request.content, self.client_timeout_s):
                if declared is not None and declared <= buffer_limit:
                    if not hold(declared):
                        raise answers.buffers_full()
                    return await request.content.readexactly(declared)
                head = bytearray()
                while len(head) <= buffer_limit:
                    chunk = await request.content.readany()
                    if not chunk:
                        return bytes(head)
                    if not hold(len(chunk)):
                        raise answers.buffers_full()
                    head.extend(chunk)
        except (HttpProcessingError, asyncio.IncompleteReadError):
            raise answers.Refusal(
                answers.BAD_REQUEST, "the request body is malformed or incomplete"
            ) from None
        except TimeoutError:
            raise client_too_slow() from None
        if self.max_request_bytes and len(head) > self.max_request_bytes:
            raise self.too_large()
        return StreamedBody(bytes(head), request, self.max_request_bytes, self.client_timeout_s)


def client_too_slow() -> answers.Refusal:
    return answers.Refusal(
        answers.CLIENT_TIMEOUT,
        "the request body did not arrive in time",
        {"reason": "client_timeout"},
    )
