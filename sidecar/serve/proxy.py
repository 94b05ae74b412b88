"""The aiohttp handler: the agent's request in, the tool's answer (or ours) out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from structlog.contextvars import bind_contextvars, reset_contextvars

from sidecar import errors, ids
from sidecar.errors import AttemptError
from sidecar.repair.payload import Payload
from sidecar.retry.controls import request_controls
from sidecar.retry.engine import Engine, Result
from sidecar.retry.policy import GAVE_UP, Outcome
from sidecar.serve.relay import relay
from sidecar.serve.routing import RouteTable, Target, has_dot_segment
from sidecar.telemetry import Hooks
from sidecar.telemetry.contract import UNMATCHED_ROUTE
from sidecar.transport.upstream import (
    UpstreamRequest,
    read_deadline,
    undeliverable_header,
    upstream_request_headers,
)

_log = structlog.get_logger("sidecar")

ProxyHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


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
                raise _client_too_slow() from None
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
        max_header_bytes: int,
    ) -> None:
        self._routes = routes
        self._engine = engine
        self._hooks = hooks
        self._max_request_bytes = max_request_bytes
        self._max_in_flight = max_in_flight
        self._client_timeout_s = client_timeout_s
        self._max_header_bytes = max_header_bytes
        self._running: set[asyncio.Task[object]] = set()
        self._waiting_for_tool: set[asyncio.Task[object]] = set()
        self._all_done = asyncio.Event()
        self._all_done.set()
        self._draining = False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-ID") or ids.request_id()
        # The path without its query, which may hold credentials.
        path = request.rel_url.raw_path
        try:
            if request.headers.get("Expect"):
                await _continue(request)
            _check_head(request, self._max_header_bytes)
        except errors.Refusal as refusal:
            # What else the agent sent on this connection cannot be trusted to be framed
            # as it thinks.
            refused = refusal.response(own_report(refusal.error))
            refused.force_close()
            return refused
        target = self._routes.match(request.raw_path)
        if target is None:
            tokens = bind_contextvars(request_id=request_id, path=path)
            self._hooks.request_finished(
                UNMATCHED_ROUTE, request.method, "not-retryable", 404, 0, 0.0, matched=False
            )
            reset_contextvars(**tokens)
            return errors.error_response(
                errors.NO_ROUTE,
                _no_route_message(request.method),
                {"path": request.path},
                own_report(errors.NO_ROUTE),
            )
        if self._max_in_flight and len(self._running) >= self._max_in_flight:
            self._hooks.sidecar_overloaded(target.route.name, "max_in_flight")
            self._hooks.request_finished(
                target.route.name, request.method, Outcome.OVERLOADED, 503, 0, 0.0, matched=False
            )
            return errors.overloaded_response(
                self._max_in_flight, own_report(errors.SIDECAR_OVERLOADED)
            )
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
            response = errors.shutdown_response(
                report_headers(Outcome.DEADLINE, "shutdown", attempts=None)
            )
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
            try:
                body = await self._read_request_body(request, route.tuning.max_body_bytes)
            except errors.Refusal as refusal:
                response: web.StreamResponse = refusal.response(own_report(refusal.error))
                if refusal.error is errors.CLIENT_TIMEOUT:
                    response.force_close()
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
                return response
            if isinstance(body, _StreamedBody) and body.exceeded:
                response = self._too_large().response(report)
            elif isinstance(body, _StreamedBody) and body.stalled:
                response = _client_too_slow().response(report)
                response.force_close()
            elif result.circuit_open_for_s is not None:
                response = errors.circuit_open_response(result.circuit_open_for_s, report)
            else:
                assert result.error is not None
                if result.error.local:
                    self._hooks.sidecar_overloaded(route.name, result.error.value)
                elif result.error is AttemptError.MALFORMED:
                    _log.warning("upstream_answer_broken", reason=result.error_reason)
                response = errors.attempt_error_response(
                    result.error, report, reason=result.error_reason
                )
            status = response.status
            return response
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

    def _too_large(self) -> errors.Refusal:
        return errors.Refusal(
            errors.REQUEST_TOO_LARGE,
            "request body is larger than the sidecar accepts",
            {"limit_bytes": self._max_request_bytes},
        )

    async def _read_request_body(
        self, request: web.BaseRequest, buffer_limit: int
    ) -> bytes | _StreamedBody:
        """The body buffered when it fits ``buffer_limit``, else a stream.

        A body over the hard limit, one the agent garbles (a bad chunk) or cuts short, and
        one that stops arriving are refused here, not left to surface as a server error.
        """
        declared = request.content_length
        if declared is not None and self._max_request_bytes and declared > self._max_request_bytes:
            raise self._too_large()
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
            raise errors.Refusal(
                errors.BAD_REQUEST, "the request body is malformed or incomplete"
            ) from None
        except TimeoutError:
            raise _client_too_slow() from None
        if self._max_request_bytes and len(head) > self._max_request_bytes:
            raise self._too_large()
        return _StreamedBody(bytes(head), request, self._max_request_bytes, self._client_timeout_s)


def _client_too_slow() -> errors.Refusal:
    return errors.Refusal(
        errors.CLIENT_TIMEOUT,
        "the request body did not arrive in time",
        {"reason": "client_timeout"},
    )


def _check_head(request: web.BaseRequest, max_header_bytes: int) -> None:
    """Refuse a request that cannot go to any tool as it is.

    A path with a ``.`` or ``..`` segment (also percent-encoded) could climb out of a
    route's prefix or an upstream's base path; header bytes that are not UTF-8 could not
    be passed on as they came; a header section over the limit is refused as a whole,
    where aiohttp's own limits hold each line.
    """
    if has_dot_segment(request.raw_path):
        raise errors.Refusal(errors.BAD_REQUEST, "path has a '.' or '..' segment")
    bad_header = undeliverable_header(request.headers)
    if bad_header is not None:
        raise errors.Refusal(errors.BAD_REQUEST, f"header {bad_header} is not valid UTF-8")
    if sum(len(name) + len(value) + 4 for name, value in request.raw_headers) > max_header_bytes:
        raise errors.Refusal(
            errors.HEADERS_TOO_LARGE,
            "the request's header section is larger than the sidecar accepts",
            {"limit_bytes": max_header_bytes},
        )


async def _continue(request: web.BaseRequest) -> None:
    """What aiohttp's application router does for ``Expect`` before its handler runs: an
    HTTP/1.1 agent expecting ``100-continue`` is told to send its body; any other
    expectation cannot be met (417)."""
    expect = request.headers["Expect"]
    if request.version != aiohttp.HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise errors.Refusal(errors.EXPECTATION_FAILED, f"unknown expectation: {expect}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer's size, for the access log, starts now
    await request.writer.drain()


def _report(result: Result) -> dict[str, str]:
    """The ``X-Sidecar-*`` headers that tell the agent what the sidecar did."""
    report = report_headers(result.outcome, ", ".join(result.trail), attempts=result.attempts)
    if result.repaired:
        report["X-Sidecar-Repaired"] = ",".join(result.repaired)
    return report


def report_headers(outcome: str, trail: str, *, attempts: int | None) -> dict[str, str]:
    """``X-Sidecar-Outcome`` and ``-Trail``, ``-Attempts`` when known, and the word that
    the agent's own client should not retry when the sidecar gave up."""
    report = {"X-Sidecar-Outcome": outcome, "X-Sidecar-Trail": trail}
    if attempts is not None:
        report["X-Sidecar-Attempts"] = str(attempts)
    if outcome in GAVE_UP:
        # The sidecar already retried what could be retried; the official OpenAI and
        # Anthropic SDKs read this header and do not add their own retries on top.
        report["x-should-retry"] = "false"
    return report


def own_report(error: errors.SidecarError) -> dict[str, str]:
    """The report on an answer the sidecar made before any attempt: none made, and the
    error's code as the trail. Only a request refused as it stands is not worth repeating."""
    outcome = Outcome.OVERLOADED if error is errors.SIDECAR_OVERLOADED else Outcome.NOT_RETRYABLE
    report = {
        "X-Sidecar-Attempts": "0",
        "X-Sidecar-Outcome": outcome,
        "X-Sidecar-Trail": error.code.lower(),
    }
    if not error.retryable:
        report["x-should-retry"] = "false"
    return report


def _no_route_message(method: str) -> str:
    if method == "CONNECT":
        return (
            "CONNECT tunnels are not supported: the sidecar is a reverse proxy; "
            "send the tool's requests to it instead of using it as an HTTP proxy"
        )
    return "no route matches this path"


class ProxyServer(web.Server):
    """aiohttp's low-level server, whose own answers to broken requests are the sidecar's.

    aiohttp answers a request it cannot parse (or a handler's crash) with a text page that
    quotes the request; an agent reading envelopes gets the envelope and the report
    instead, and nothing of what it sent is echoed.
    """

    def __init__(self, handler: ProxyHandler, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._protocol_kwargs = {
            key: value for key, value in kwargs.items() if key != "handler_cancellation"
        }

    def __call__(self) -> web.RequestHandler:
        return _ProxyRequestHandler(self, loop=asyncio.get_running_loop(), **self._protocol_kwargs)


class _ProxyRequestHandler(web.RequestHandler):
    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._request_line_limit: int = kwargs["max_line_size"]

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own handling logs the error (a client's as its fault) and checks that
        # no answer has started yet; its text page is replaced.
        super().handle_error(request, status, exc, message)
        refusal = _refusal_for(status, exc, self._request_line_limit)
        response = refusal.response(own_report(refusal.error))
        response.force_close()
        return response


def _refusal_for(status: int, exc: BaseException | None, request_line_limit: int) -> errors.Refusal:
    if status >= 500:
        return errors.Refusal(errors.SIDECAR_ERROR, "the sidecar failed to handle the request")
    if isinstance(exc, LineTooLong):
        # aiohttp names the limit that was passed: the request line's, or a header line's.
        if exc.args[1:2] == (request_line_limit,):
            return errors.Refusal(errors.URI_TOO_LONG, "the request line is too long")
        return errors.Refusal(errors.HEADERS_TOO_LARGE, "a header line of the request is too long")
    return errors.Refusal(errors.BAD_REQUEST, "the request is not valid HTTP/1.1")
