"""The aiohttp handler: the agent's request in, the tool's answer (or ours) out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from structlog.contextvars import bind_contextvars, reset_contextvars

from sidecar import errors, ids
from sidecar.controls import request_controls
from sidecar.engine import Engine, Result
from sidecar.http1 import ConnectionBroken
from sidecar.observe import UNMATCHED_ROUTE
from sidecar.policy import GAVE_UP, Outcome
from sidecar.repair.payload import Payload
from sidecar.routing import RouteTable, Target, has_dot_segment
from sidecar.telemetry import Hooks
from sidecar.upstream import (
    Answer,
    UpstreamRequest,
    end_to_end_headers,
    read_deadline,
    undeliverable_header,
    upstream_request_headers,
)

_log = structlog.get_logger("sidecar")


class _ClientTooSlow(Exception):
    """The agent stopped sending its request body for longer than the client timeout."""


@dataclass(slots=True)
class _StreamedBody:
    """A request body too large to buffer, passed on as it arrives (never replayed)."""

    head: bytes
    request: web.BaseRequest
    hard_limit: int
    idle_timeout_s: float
    exceeded: bool = False
    stalled: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        sent = len(self.head)
        yield self.head
        while True:
            try:
                async with asyncio.timeout(self.idle_timeout_s):
                    chunk = await self.request.content.readany()
            except TimeoutError:
                self.stalled = True
                raise _ClientTooSlow from None
            if not chunk:
                return
            sent += len(chunk)
            if self.hard_limit and sent > self.hard_limit:
                self.exceeded = True
                raise errors.RequestTooLarge
            yield chunk


class Proxy:
    """Forwards every method and path to the route's upstream, through the retry engine.

    It also keeps the books a graceful shutdown needs: which requests are running, and
    which of them still wait for the tool (and so can still get an answer of ours).
    """

    def __init__(
        self,
        routes: RouteTable,
        engine: Engine,
        hooks: Hooks,
        *,
        max_request_bytes: int,
        max_in_flight: int,
        client_timeout_s: float,
    ) -> None:
        self._routes = routes
        self._engine = engine
        self._hooks = hooks
        self._max_request_bytes = max_request_bytes
        self._max_in_flight = max_in_flight
        self._client_timeout_s = client_timeout_s
        self._running: set[asyncio.Task[object]] = set()
        self._waiting_for_tool: set[asyncio.Task[object]] = set()
        self._all_done = asyncio.Event()
        self._all_done.set()
        self._draining = False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get("Expect"):
            await _continue(request)
        request_id = request.headers.get("X-Request-ID") or ids.request_id()
        if has_dot_segment(request.raw_path):
            raise web.HTTPBadRequest(text="path has a '.' or '..' segment")
        # The path without its query, which may hold credentials.
        path = request.rel_url.raw_path
        target = self._routes.match(request.raw_path)
        if target is None:
            tokens = bind_contextvars(request_id=request_id, path=path)
            self._hooks.request_finished(
                UNMATCHED_ROUTE, request.method, "not-retryable", 404, 0, 0.0, matched=False
            )
            reset_contextvars(**tokens)
            return errors.error_response(
                errors.NO_ROUTE, _no_route_message(request.method), {"path": request.path}
            )
        if self._max_in_flight and len(self._running) >= self._max_in_flight:
            self._hooks.sidecar_overloaded(target.route.name, "max_in_flight")
            self._hooks.request_finished(
                target.route.name, request.method, Outcome.OVERLOADED, 503, 0, 0.0, matched=False
            )
            return errors.overloaded_response(self._max_in_flight)
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        self._waiting_for_tool.add(task)
        self._all_done.clear()
        # Every line logged for this request carries these. Set and reset by token:
        # structlog's ``bound_contextvars`` first copies the whole context to save it.
        tokens = bind_contextvars(
            request_id=request_id, route=target.route.name, method=request.method, path=path
        )
        try:
            response = await self._forward(request, target, request_id, task)
        except asyncio.CancelledError:
            if not (self._draining and task in self._waiting_for_tool):
                raise
            # The drain time ran out while the tool still had not answered: say so.
            task.uncancel()
            response = errors.shutdown_response()
        finally:
            reset_contextvars(**tokens)
            self._running.discard(task)
            self._waiting_for_tool.discard(task)
            if not self._running:
                self._all_done.set()
        if self._draining:
            response.force_close()
        return response

    async def drain(self, timeout_s: float) -> None:
        """Let the requests in flight finish for up to ``timeout_s``, then cut the rest.

        A request still waiting for the tool then gets ``UPSTREAM_TIMEOUT`` with
        ``details.reason: "shutdown"``; one whose answer is already streaming is cut.
        """
        self._draining = True
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout_s)
        except TimeoutError:
            for task in list(self._running):
                task.cancel()

    async def _forward(
        self,
        request: web.BaseRequest,
        target: Target,
        request_id: str,
        task: asyncio.Task[object],
    ) -> web.StreamResponse:
        started = time.monotonic()
        route = target.route
        self._hooks.request_received(route.name, request.method, request.headers)
        status, outcome, attempts, trail = 0, "not-retryable", 0, ""
        try:
            bad_header = undeliverable_header(request.headers)
            if bad_header is not None:
                raise web.HTTPBadRequest(text=f"header {bad_header} is not valid UTF-8")
            try:
                body = await self._read_request_body(request, route.tuning.max_body_bytes)
            except _ClientTooSlow:
                response: web.StreamResponse = errors.client_timeout_response()
                status = response.status
                return response
            if body is None:
                response = self._too_large()
                status = response.status
                return response
            headers = upstream_request_headers(
                request.headers,
                client_address=request.remote,
                scheme=request.scheme,
                request_id=request_id,
            )
            result = await self._engine.run(
                route,
                UpstreamRequest(
                    method=request.method,
                    url=target.url,
                    headers=headers,
                    body=body.chunks() if isinstance(body, _StreamedBody) else body,
                ),
                request_controls(route.tuning, request.headers),
                None if isinstance(body, _StreamedBody) else Payload(body),
            )
            outcome, attempts, trail = result.outcome, result.attempts, ", ".join(result.trail)
            self._waiting_for_tool.discard(task)
            report = _report(result)
            if result.answer is not None:
                status = result.answer.status
                response = await relay(request, result.answer, report)
                status = response.status  # a broken answer goes out as the sidecar's 502
                return response
            if isinstance(body, _StreamedBody) and body.exceeded:
                response = self._too_large()
            elif isinstance(body, _StreamedBody) and body.stalled:
                response = errors.client_timeout_response()
            elif result.circuit_open_for_s is not None:
                response = errors.circuit_open_response(result.circuit_open_for_s, report)
            else:
                assert result.error is not None
                if result.error.local:
                    self._hooks.sidecar_overloaded(route.name, result.error.value)
                response = errors.attempt_error_response(result.error, report)
            status = response.status
            return response
        except web.HTTPException as refusal:
            status = refusal.status
            raise
        finally:
            self._hooks.request_finished(
                route.name,
                request.method,
                outcome,
                status,
                attempts,
                time.monotonic() - started,
                trail=trail,
            )

    def _too_large(self) -> web.Response:
        return errors.error_response(
            errors.REQUEST_TOO_LARGE,
            "request body is larger than the sidecar accepts",
            {"limit_bytes": self._max_request_bytes},
        )

    async def _read_request_body(
        self, request: web.BaseRequest, buffer_limit: int
    ) -> bytes | _StreamedBody | None:
        """The body buffered when it fits ``buffer_limit``, else a stream; None if too large.

        A body the agent garbles (a bad chunk) or cuts short is answered 400 here, not
        left to surface as a server error.
        """
        declared = request.content_length
        if declared is not None and self._max_request_bytes and declared > self._max_request_bytes:
            return None
        if not request.body_exists:
            return b""
        try:
            async with read_deadline(request.content, self._client_timeout_s):
                if declared is not None and declared <= buffer_limit:
                    return await request.content.readexactly(declared)
                head = bytearray()
                while len(head) <= buffer_limit:
                    chunk = await request.content.readany()
                    if not chunk:
                        return bytes(head)
                    head.extend(chunk)
        except (HttpProcessingError, asyncio.IncompleteReadError):
            raise web.HTTPBadRequest(text="the request body is malformed or incomplete") from None
        except TimeoutError:
            raise _ClientTooSlow from None
        if self._max_request_bytes and len(head) > self._max_request_bytes:
            return None
        return _StreamedBody(bytes(head), request, self._max_request_bytes, self._client_timeout_s)


async def _continue(request: web.BaseRequest) -> None:
    """What aiohttp's application router does for ``Expect`` before its handler runs: an
    HTTP/1.1 agent expecting ``100-continue`` is told to send its body; any other
    expectation cannot be met (417)."""
    expect = request.headers["Expect"]
    if request.version != aiohttp.HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer's size, for the access log, starts now
    await request.writer.drain()


def _report(result: Result) -> dict[str, str]:
    """The ``X-Sidecar-*`` headers that tell the agent what the sidecar did."""
    report = {
        "X-Sidecar-Attempts": str(result.attempts),
        "X-Sidecar-Outcome": result.outcome,
        "X-Sidecar-Trail": ", ".join(result.trail),
    }
    if result.repaired:
        report["X-Sidecar-Repaired"] = ",".join(result.repaired)
    if result.outcome in GAVE_UP:
        # The sidecar already retried what could be retried; the official OpenAI and
        # Anthropic SDKs read this header and do not add their own retries on top.
        report["x-should-retry"] = "false"
    return report


def _why_not_relayable(answer: Answer) -> str | None:
    """What in ``answer`` the agent could not receive unchanged, if anything.

    aiohttp takes any three digits as a status, and decodes bytes that are not UTF-8 to
    surrogates, which its writer would drop from a header or reason phrase.
    """
    if not 100 <= answer.status <= 599:
        return f"status {answer.status} out of range"
    bad_header = undeliverable_header(answer.response.headers)
    if bad_header is not None:
        return f"header {bad_header} is not valid UTF-8"
    try:
        (answer.response.reason or "").encode("utf-8")
    except UnicodeEncodeError:
        return "reason phrase is not valid UTF-8"
    return None


def _no_route_message(method: str) -> str:
    if method == "CONNECT":
        return (
            "CONNECT tunnels are not supported: the sidecar is a reverse proxy; "
            "send the tool's requests to it instead of using it as an HTTP proxy"
        )
    return "no route matches this path"


async def relay(
    request: web.BaseRequest, answer: Answer, extra_headers: Mapping[str, str]
) -> web.StreamResponse:
    """The tool's status, headers and body bytes as they came, plus ``extra_headers``.

    A body read whole goes out with its length; the rest streams chunk by chunk. If the
    tool breaks off mid-stream the agent's connection is closed too, so a cut body can
    never pass for a whole one. An answer that cannot go out as it came is a broken
    answer: the agent gets ``UPSTREAM_RESET`` saying why.
    """
    broken = _why_not_relayable(answer)
    if broken is not None:
        answer.discard()
        _log.warning("upstream_answer_broken", status=answer.status, reason=broken)
        return errors.error_response(
            errors.UPSTREAM_RESET,
            "the tool's answer cannot be passed on as it was sent",
            {"reason": broken},
            extra_headers,
        )
    headers = end_to_end_headers(answer.response.headers)
    headers.update(extra_headers)
    if answer.complete:
        # Headers and body leave in one write; aiohttp sets the length from the body.
        answer.discard()
        headers.popall("Content-Length", None)
        return web.Response(
            status=answer.status, reason=answer.response.reason, headers=headers, body=answer.body
        )
    response = web.StreamResponse(
        status=answer.status, reason=answer.response.reason, headers=headers
    )
    try:
        await response.prepare(request)
        if answer.body:
            await response.write(answer.body)
        if not answer.complete:
            async for chunk in answer.response.content.iter_any():
                await response.write(chunk)
        await response.write_eof()
    except ConnectionResetError:
        _log.debug("client_disconnected", status=answer.status)
    except (ConnectionBroken, OSError) as exc:
        _log.warning("upstream_stream_broken", status=answer.status, reason=type(exc).__name__)
        if request.transport is not None:
            request.transport.close()
    finally:
        answer.discard()
    return response
