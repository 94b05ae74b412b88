"""The contract between the pipeline and the sinks: ``Hooks``, the methods the pipeline
calls, and ``Sink``, what records the events those calls make.

Each ``Hooks`` method makes one event (``telemetry.events``) and hands it to every sink
with a method of the event's name, in the order the sinks were registered (as structlog
passes an event through its processors). A sink's methods are checked when it is
registered: a public method that names no event, or takes another event than its name
says, is an error at start-up, not a record silently never made. Sinks read frozen events
and hand each other nothing: what one sink knows that the pipeline or the others use (an
attempt's trace context, a sampled span's ids for an exemplar) the ``Tracer`` is asked
for, and it goes into the event or to the pipeline that asked. Nothing a sink does changes
what the pipeline decides.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Protocol, get_type_hints

from sidecar.outcomes import Wait
from sidecar.telemetry.events import (
    ALL_EVENTS,
    AttemptFinished,
    AttemptStarted,
    BudgetExhausted,
    CircuitRefused,
    CircuitStateReported,
    Event,
    HedgeFinished,
    LlmCallFinished,
    LlmFormatRefused,
    LlmReask,
    PayloadRepaired,
    RepairedRetry,
    RepairFinished,
    RepairRefused,
    RepairResult,
    RepairStarted,
    Request,
    RequestFinished,
    RequestReceived,
    RetryScheduled,
    SchemaUnavailable,
    SessionReopened,
    SidecarOverloaded,
    StateError,
)
from sidecar.tool.envelopes import ToolFailure

# The route a request is recorded under when no route matched its path.
UNMATCHED_ROUTE = "(none)"


class Sink:
    """Something that records events: one method per event of interest, named as the event
    and taking it, e.g. ``def attempt_finished(self, event: AttemptFinished) -> None``.
    Every other method is private (``_name``), ``flush`` and ``close`` aside; those two run
    off the event loop (they may block on exporting).
    """

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


_SINK_METHODS = frozenset(name for name in vars(Sink) if not name.startswith("_"))


def _handlers_of(sink: Sink) -> dict[type[Event], Callable[[Any], object]]:
    """The sink's method for each event it records, checked against ``ALL_EVENTS``.

    Raises ``TypeError`` for a public method that names no event (a misspelling would
    otherwise never be called) or whose one parameter is not its event's class.
    """
    found: dict[type[Event], Callable[[Any], object]] = {}
    kind = type(sink)
    for name in dir(kind):
        method = getattr(kind, name)
        if name.startswith("_") or name in _SINK_METHODS or not callable(method):
            continue
        event = ALL_EVENTS.get(name)
        if event is None:
            raise TypeError(
                f"{kind.__qualname__}.{name} names no telemetry event (a sink's public "
                f"methods are its events: {', '.join(sorted(ALL_EVENTS))})"
            )
        parameters = list(inspect.signature(method).parameters)[1:]
        if len(parameters) != 1 or get_type_hints(method).get(parameters[0]) != event:
            raise TypeError(
                f"{kind.__qualname__}.{name} must take one {event.__name__} and nothing else"
            )
        found[event] = getattr(sink, name)
    return found


# The running task's request: the pipeline's deeper layers (repairs, the LLM) report events
# without carrying the request through their own signatures.
_current: ContextVar[Request | None] = ContextVar("sidecar_request", default=None)


class Tracer(Protocol):
    """What the tracing sink knows of a request's spans that others use."""

    def trace_headers(self, request: Request, attempt: int) -> dict[str, str] | None:
        """The headers that carry attempt ``attempt``'s span context upstream."""
        ...

    def exemplar(self, request: Request, attempt: int | None) -> dict[str, str] | None:
        """The ids of the attempt's span (``None``: the request's), when it is sampled."""
        ...


class Hooks:
    """The pipeline's side of the contract, one method per event. One per app."""

    def __init__(self, sinks: Sequence[Sink], tracer: Tracer | None = None) -> None:
        self.sinks = tuple(sinks)
        self._tracer = tracer
        checked = [_handlers_of(sink) for sink in self.sinks]
        self._handlers: dict[type[Event], tuple[Callable[[Any], object], ...]] = {
            event: tuple(found[event] for found in checked if event in found)
            for event in ALL_EVENTS.values()
        }
        # Each circuit's state as last reported: the engine reports it twice per request,
        # nearly always unchanged, and setting the gauge each time cost ~25k instructions
        # per request (of ~900k).
        self._circuit_states: dict[tuple[str, str], int] = {}

    def _emit(self, event: Event) -> None:
        for handle in self._handlers[type(event)]:
            handle(event)

    def request_received(
        self, route: str, method: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """A request was matched to ``route``: it is now in flight."""
        request = Request(route, method)
        _current.set(request)
        self._emit(RequestReceived(route, method, headers, request))

    def attempt_started(self, attempt: int, *, hedge: bool = False) -> dict[str, str] | None:
        """Attempt ``attempt`` is about to be sent; the headers it must carry upstream (its
        trace context), when it is traced. A ``hedge`` is a copy of the attempt before it,
        which is still waiting."""
        current = _current.get()
        if current is not None:
            current.attempt = attempt
        if self._handlers[AttemptStarted]:  # only traces want it: with tracing off, no event
            self._emit(AttemptStarted(attempt, current, hedge))
        if self._tracer is None or current is None:
            return None
        return self._tracer.trace_headers(current, attempt)

    def attempt_finished(
        self,
        route: str,
        attempt: int,
        label: str,
        duration_s: float,
        failure: ToolFailure | None,
    ) -> None:
        """One upstream attempt ended; ``label`` is its status code or its error kind."""
        request = _attempt_of(route, attempt)
        exemplar = self._exemplar(request, attempt)
        self._emit(AttemptFinished(route, attempt, label, duration_s, failure, request, exemplar))

    def retry_scheduled(
        self,
        route: str,
        attempt: int,
        label: str,
        reason: str,
        wait: Wait,
        failure: ToolFailure | None,
    ) -> None:
        """A retry will follow attempt ``attempt`` after ``wait``."""
        request = _attempt_of(route, attempt)
        self._emit(RetryScheduled(route, attempt, label, reason, wait, failure, request))

    def repaired_retry(self, route: str, attempt: int, label: str, layer: str) -> None:
        """A repaired payload will be sent right away after attempt ``attempt``."""
        request = _attempt_of(route, attempt)
        self._emit(RepairedRetry(route, attempt, label, layer, request))

    def repair_started(self, route: str) -> None:
        """The repair layers are asked for a new payload after a failed attempt."""
        request = _of(route)
        self._emit(RepairStarted(route, request.attempt if request else 0, request))

    def repair_finished(self, route: str, layer: str | None) -> None:
        """The repair layers answered: ``layer`` made a new payload, or (``None``) none did."""
        self._emit(RepairFinished(route, layer or "", _of(route)))

    def payload_repaired(self, route: str, layer: str, fields: list[str]) -> None:
        """A layer changed these fields of the payload (their values are never recorded)."""
        request = _of(route)
        if request is not None:
            request.repairs += ((layer, tuple(fields)),)
        self._emit(PayloadRepaired(route, layer, fields, request))

    def repair_result(self, route: str, layer: str, result: str) -> None:
        """A layer's work ended: ``succeeded``/``failed`` (its payload's answer), ``declined``."""
        self._emit(RepairResult(route, layer, result, _of(route)))

    def repair_refused(
        self, route: str, layer: str, why: str, fields: tuple[str, ...] = ()
    ) -> None:
        """A layer's proposal broke a guardrail and was not sent; ``fields``, for a proposal
        out of scope, are the names of the fields it touched outside it."""
        self._emit(RepairRefused(route, layer, why, _of(route), fields))

    def llm_call_finished(
        self,
        result: str,
        duration_s: float,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        failure: BaseException | None = None,
        response_format: str = "json_object",
    ) -> None:
        """One call to the LLM ended: ``ok``, ``error``, ``timeout`` or ``invalid``, its
        answer held to ``response_format``."""
        self._emit(
            LlmCallFinished(
                result,
                duration_s,
                prompt_tokens,
                completion_tokens,
                failure,
                response_format,
                _current.get(),
            )
        )

    def llm_format_refused(self, response_format: str, status: int) -> None:
        """The LLM endpoint refused that form of ``response_format``; the next is tried."""
        self._emit(LlmFormatRefused(response_format, status))

    def llm_reask(self, route: str, reason: str) -> None:
        """The model's answer was refused for ``reason`` (a kind); it is asked again, told why."""
        self._emit(LlmReask(route, reason))

    def schema_unavailable(self, route: str, reason: str) -> None:
        """A route's schema could not be loaded; the route runs without (or with the last)."""
        self._emit(SchemaUnavailable(route, reason))

    def budget_exhausted(self, route: str) -> None:
        """A retry was refused: the route's retry budget is spent."""
        self._emit(BudgetExhausted(route, _of(route)))

    def session_reopened(self, route: str, opened: bool) -> None:
        """A request's MCP session, which its server forgot, was opened again (``opened``)
        or could not be (the agent gets the server's 404)."""
        self._emit(SessionReopened(route, opened, _of(route)))

    def sidecar_overloaded(self, route: str | None, reason: str) -> None:
        """The sidecar itself had no room for a call: ``max_in_flight``, ``pool_timeout``
        (no free upstream connection), ``fd_exhausted`` or ``max_buffered_bytes``."""
        self._emit(SidecarOverloaded(route or "", reason, _of(route)))

    def circuit_state(self, route: str, state_now: int, tool: str = "") -> None:
        """The circuit breaker of the route's ``tool`` (``""``: the whole route's) is in
        ``state_now`` (0 closed, 1 half-open, 2 open); an unchanged state makes no event."""
        key = (route, tool)
        if self._circuit_states.get(key) == state_now:
            return
        self._circuit_states[key] = state_now
        self._emit(CircuitStateReported(route, state_now, tool))

    def circuit_refused(self, route: str, tool: str = "") -> None:
        """The open circuit of the route's ``tool`` refused a request without trying it."""
        self._emit(CircuitRefused(route, _of(route), tool))

    def hedge_finished(self, route: str, result: str) -> None:
        """A hedged attempt's race ended: ``won``, ``lost`` or ``unanswered`` (the copy's)."""
        self._emit(HedgeFinished(route, result, _of(route)))

    def state_error(self, op: str, error: BaseException) -> None:
        """A call to the fleet state store failed; the request went on with local state."""
        self._emit(StateError(op, error))

    def request_finished(
        self,
        route: str,
        method: str,
        outcome: str,
        status: int,
        attempts: int,
        duration_s: float,
        *,
        path: str = "",
        trail: str = "",
        matched: bool = True,
    ) -> None:
        """The answer's headers went to the agent (or the agent went away); ``path`` is the
        agent's, without its query."""
        request = _of(route) if matched else None
        exemplar = self._exemplar(request, None)
        self._emit(
            RequestFinished(
                route,
                method,
                path,
                outcome,
                status,
                attempts,
                duration_s,
                trail,
                matched,
                request,
                exemplar,
            )
        )
        if matched:
            _current.set(None)

    def _exemplar(self, request: Request | None, attempt: int | None) -> dict[str, str] | None:
        if self._tracer is None or request is None:
            return None
        return self._tracer.exemplar(request, attempt)

    def flush(self) -> None:
        """Every sink's buffered records sent on (blocking: call it off the event loop)."""
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        """Every sink flushed and stopped (blocking: call it off the event loop)."""
        for sink in self.sinks:
            sink.close()


def _of(route: str | None) -> Request | None:
    """The running request when it is ``route``'s; ``None`` outside one or for another."""
    request = _current.get()
    return request if request is not None and request.route == route else None


def _attempt_of(route: str, attempt: int) -> Request | None:
    """The running request, told its latest attempt, when it is ``route``'s."""
    request = _of(route)
    if request is not None:
        request.attempt = attempt
    return request
