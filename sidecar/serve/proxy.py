"""The proxy's handler: the agent's request in, the tool's answer (or ours) out."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog
from structlog.contextvars import bind_contextvars, reset_contextvars

from sidecar import ids
from sidecar.config import RouteConfig
from sidecar.credentials import mask_path
from sidecar.outcomes import AttemptError, Outcome
from sidecar.repair.payload import Payload
from sidecar.retry.cancel import InFlight
from sidecar.retry.controls import request_controls
from sidecar.retry.engine import Engine
from sidecar.retry.replay import LONG_LIVED_METHODS, SESSION_HEADER, mcp_call
from sidecar.retry.steps import Paused, Relayed, Result, Unanswered
from sidecar.serve import answers
from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.serve.intake import BodyIntake, StreamedBody, client_too_slow
from sidecar.serve.relay import StreamTerms, relay
from sidecar.serve.routing import RouteTable, Target
from sidecar.telemetry import Hooks
from sidecar.telemetry.contract import UNMATCHED_ROUTE
from sidecar.tool.eventstream import is_event_stream
from sidecar.transport.connection import RequestBody
from sidecar.transport.exchange import Answer, UpstreamRequest
from sidecar.wire.buffers import BufferBudget, Ledger
from sidecar.wire.headers import upstream_request_headers

_log = structlog.get_logger("sidecar")


@dataclass(slots=True)
class _Call:
    """One agent request as the proxy reports it when it ends (``request_finished``)."""

    method: str
    route: str
    started: float | None = None  # set once the request is taken on for a route
    status: int = 0
    outcome: str = Outcome.NOT_RETRYABLE
    attempts: int = 0
    trail: str = ""
    body: bytes | None = None  # the agent's body, once read whole

    def opens_session(self) -> bool:
        """Whether the agent's body is an MCP ``initialize``."""
        body = self.body
        if body is None or b'"initialize"' not in body:
            return False
        rpc = mcp_call(body)
        return rpc is not None and rpc.method == "initialize"

    def own(self, reply: AgentReply) -> AgentReply:
        """``reply``, an answer of the sidecar's own, in the protocol of the request: a
        JSON-RPC request (an MCP client's) gets a JSON-RPC error for its id."""
        rpc = mcp_call(self.body) if self.body else None
        if rpc is None or rpc.id is None:
            return reply
        return answers.in_json_rpc(reply, rpc.id)

    def elapsed_s(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started


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
        buffers: BufferBudget,
    ) -> None:
        self._routes = routes
        self._engine = engine
        self._hooks = hooks
        self._intake = BodyIntake(max_request_bytes, client_timeout_s)
        self._max_in_flight = max_in_flight
        self._buffers = buffers
        self._running: set[asyncio.Task[object]] = set()
        self._sending = 0  # requests past their body, counted against ``max_in_flight``
        self._waiting_for_tool: set[asyncio.Task[object]] = set()
        self._all_done = asyncio.Event()
        self._all_done.set()
        self._draining = False
        self._mcp_requests = InFlight()  # what an MCP ``notifications/cancelled`` can stop
        # Set when the drain starts: event streams that carry no call end at an event boundary.
        self._streams_end = asyncio.Event()

    async def handle(self, request: AgentRequest) -> AgentReply:
        """Answer ``request``, whose head the agent's server checked (``httpserver``)."""
        request_id = request.headers.get("X-Request-ID") or ids.request_id()
        target = self._routes.match(request.raw_path)
        call = _Call(request.method, target.route.name if target else UNMATCHED_ROUTE)
        # Every line logged for this request carries these (the path without its query,
        # masked, as a query and a path may hold credentials). Set and reset by token:
        # structlog's ``bound_contextvars`` first copies the whole context to save it.
        path = mask_path(request.raw_path_without_query)
        if target is None:
            tokens = bind_contextvars(request_id=request_id, path=path)
        else:
            tokens = bind_contextvars(
                request_id=request_id, route=call.route, method=call.method, path=path
            )
        try:
            if target is None:
                call.status = 404
                return answers.error_response(
                    answers.NO_ROUTE,
                    _no_route_message(request.method),
                    {"path": request.path},
                    answers.own_report(answers.NO_ROUTE),
                )
            response = await self._admit(request, target, request_id, call)
        finally:
            self._hooks.request_finished(
                call.route,
                call.method,
                call.outcome,
                call.status,
                call.attempts,
                call.elapsed_s(),
                path=path,
                trail=call.trail,
                matched=call.started is not None,
            )
            reset_contextvars(**tokens)
        if self._draining:
            response.force_close()
        return response

    async def drain(self, timeout_s: float) -> None:
        """Let the requests in flight finish for up to ``timeout_s``, then cut the rest.

        An event stream that carries no call (a ``GET``'s: MCP's own stream, a feed) ends
        at once, after its last whole event: it would otherwise hold the drain for all of
        ``timeout_s``. A request still waiting for the tool then gets ``UPSTREAM_TIMEOUT``
        with ``details.reason: "shutdown"``; one whose answer is already streaming is cut.
        """
        self._draining = True
        self._streams_end.set()
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout_s)
        except TimeoutError:
            for task in list(self._running):
                task.cancel()

    async def _admit(
        self, request: AgentRequest, target: Target, request_id: str, call: _Call
    ) -> AgentReply:
        """Forward the request, keeping the books the drain needs."""
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        self._waiting_for_tool.add(task)
        self._all_done.clear()
        try:
            with Ledger(self._buffers):
                return await self._forward(request, target, request_id, call, task)
        except asyncio.CancelledError:
            if task not in self._waiting_for_tool:
                raise  # the tool's answer was in: its outcome stands
            # Before the tool's answer, the agent went away (an SDK's timeout closes its
            # connection) or the drain time ran out: a deadline, as for an MCP
            # cancellation, not a verdict on the tool.
            call.outcome = Outcome.DEADLINE
            if not self._draining:
                raise
            task.uncancel()
            response = call.own(
                answers.shutdown_response(
                    answers.report_headers(Outcome.DEADLINE, "shutdown", attempts=None)
                )
            )
            call.status = response.status
            return response
        finally:
            self._running.discard(task)
            self._waiting_for_tool.discard(task)
            if not self._running:
                self._all_done.set()

    async def _forward(
        self,
        request: AgentRequest,
        target: Target,
        request_id: str,
        call: _Call,
        task: asyncio.Task[object],
    ) -> AgentReply:
        """The request's body read, then the request sent if there is room for it."""
        route = target.route
        call.started = time.monotonic()
        self._hooks.request_received(route.name, request.method, request.headers)
        try:
            body = await self._intake.read(request, route.tuning.max_body_bytes)
        except answers.Refusal as refusal:
            return self._refused_body(refusal, call)
        if isinstance(body, bytes):
            call.body = body
        # Only a request whose body is in (or, streamed, its first part) takes a slot of the
        # in-flight limit: 2,100 uploads trickling in held all 2,048 slots for the client
        # timeout, and every other agent got 503 meanwhile.
        if self._max_in_flight and self._sending >= self._max_in_flight:
            self._hooks.sidecar_overloaded(route.name, "max_in_flight")
            call.outcome, call.status = Outcome.OVERLOADED, 503
            return call.own(
                answers.overloaded_response(
                    self._max_in_flight, answers.own_report(answers.SIDECAR_OVERLOADED)
                )
            )
        self._sending += 1
        try:
            return await self._send(request, target, request_id, body, call, task)
        finally:
            self._sending -= 1

    async def _send(
        self,
        request: AgentRequest,
        target: Target,
        request_id: str,
        body: bytes | StreamedBody,
        call: _Call,
        task: asyncio.Task[object],
    ) -> AgentReply:
        """The request, its body in, through the retry engine; the tool's answer relayed,
        or ours."""
        route = target.route
        controls = request_controls(route.tuning, request.headers)
        deadline = asyncio.get_running_loop().time() + controls.timeout_s
        headers = upstream_request_headers(
            request.headers, client_address=request.remote, scheme=request.scheme,
            request_id=request_id,
        )  # fmt: skip
        sent: RequestBody
        if isinstance(body, StreamedBody):
            sent, payload = body.chunks(), None
        else:
            sent, payload = body, Payload(body)
        host = None if route.tuning.host_rewrite else request.headers.get("Host")
        upstream = UpstreamRequest(request.method, target.url, headers, sent, host=host)
        buffered = None if payload is None else payload.body
        with self._mcp_requests.watch(route.name, request.headers, buffered) as stop:
            result = await self._engine.run(route, upstream, controls, payload, stop)
        call.outcome, call.attempts = result.outcome, result.attempts
        call.trail = ", ".join(result.trail)
        self._waiting_for_tool.discard(task)
        if isinstance(result, Relayed):
            answer = result.answer
            call.status = answer.status
            report = _report(result)
            if SESSION_HEADER in request.headers or call.opens_session():
                try:
                    await self._keep_session_books(request, call, route, answer, report)
                except BaseException:
                    answer.discard()  # the agent went away before the relay took it
                    raise
            stream = self._stream_terms(request, call, route, answer, deadline)
            return await relay(request, answer, report, stream)
        streamed = body if isinstance(body, StreamedBody) else None
        response = call.own(self._answer_of_our_own(call.route, result, streamed))
        call.status = response.status
        return response

    async def _keep_session_books(
        self,
        request: AgentRequest,
        call: _Call,
        route: RouteConfig,
        answer: Answer,
        report: dict[str, str],
    ) -> None:
        """An MCP session opened or ended, as the route's sessions remember them; the
        agent's own session id in ``report`` when the answer names the server's new one."""
        sessions = self._engine.guards[route.name].sessions
        agents = await sessions.answered(
            request.method,
            request.headers.get(SESSION_HEADER),
            call.body if call.opens_session() else None,
            answer.status,
            answer.response.headers.get(SESSION_HEADER),
        )
        if agents is not None:
            report[SESSION_HEADER] = agents

    def _stream_terms(
        self,
        request: AgentRequest,
        call: _Call,
        route: RouteConfig,
        answer: Answer,
        deadline: float,
    ) -> StreamTerms | None:
        """How long the tool's event stream may go on (``None``: not an event stream). A
        ``GET`` or an MCP ``subscriptions/listen`` carries no answer to wait for: its stream
        ends at the drain; a call's stream not yet past its answer is owed one, by the
        request's ``deadline`` (loop time) at the latest."""
        if not is_event_stream(answer.response.content_type):
            return None
        rpc = mcp_call(call.body) if call.body else None
        long_lived = request.method == "GET" or (
            rpc is not None and rpc.method in LONG_LIVED_METHODS
        )
        tuning = route.tuning
        at_most = asyncio.get_running_loop().time() + tuning.per_try_max_ms / 1000
        return StreamTerms(
            self._streams_end,
            answer_due=not long_lived and answer.reader is not None and not answer.decisive,
            idle_s=tuning.per_try_timeout_ms / 1000,
            until=min(deadline, at_most),
            until_is_deadline=deadline < at_most,
        )

    def _answer_of_our_own(
        self, route: str, result: Unanswered | Paused, streamed: StreamedBody | None
    ) -> AgentReply:
        """The answer when the tool gave none the agent can have."""
        report = _report(result)
        if streamed is not None and streamed.exceeded:
            return self._intake.too_large().response(report)
        if streamed is not None and streamed.stalled:
            response = client_too_slow().response(report)
            response.force_close()
            return response
        if isinstance(result, Paused):
            return answers.circuit_open_response(result.open_for_s, result.tool, report)
        error = result.error
        if error.local:
            self._hooks.sidecar_overloaded(route, error.value)
        elif error is AttemptError.MALFORMED:
            _log.warning("upstream_answer_broken", reason=result.reason)
        return answers.attempt_error_response(error, report, reason=result.reason)

    def _refused_body(self, refusal: answers.Refusal, call: _Call) -> AgentReply:
        """The answer to a body that could not be read: too large, too slow, malformed, or
        past the memory budget (its agent should try again shortly, on a new connection:
        the rest of its body is not read)."""
        if refusal.error is answers.SIDECAR_OVERLOADED:
            self._hooks.sidecar_overloaded(call.route, "max_buffered_bytes")
            call.outcome = Outcome.OVERLOADED
        refused = refusal.response(answers.refusal_report(refusal.error))
        if refusal.error in (answers.CLIENT_TIMEOUT, answers.SIDECAR_OVERLOADED):
            refused.force_close()
        call.status = refused.status
        return refused


def _report(result: Result[Answer]) -> dict[str, str]:
    """The ``X-Sidecar-*`` headers that tell the agent what the sidecar did."""
    report = answers.report_headers(
        result.outcome, ", ".join(result.trail), attempts=result.attempts
    )
    if isinstance(result, Relayed) and result.repaired:
        report["X-Sidecar-Repaired"] = ",".join(result.repaired)
    return report


def _no_route_message(method: str) -> str:
    if method == "CONNECT":
        return (
            "CONNECT tunnels are not supported: the sidecar is a reverse proxy; "
            "send the tool's requests to it instead of using it as an HTTP proxy"
        )
    return "no route matches this path"
