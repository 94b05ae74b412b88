"""The stages of a request, and the one object each stage hands to every sink.

The pipeline calls one ``Hooks`` method per stage. The method writes that stage's facts
onto the request's ``RequestState`` and passes the state to each sink that has a method
of the stage's name, in the order the sinks were registered (as structlog passes an event
through its processors). A sink reads what it needs and keeps its own per-request data in
``state.scratch``; nothing a sink does changes what the pipeline decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sidecar.retry.policy import Wait
from sidecar.tool.envelopes import ToolFailure

# The route a request is recorded under when no route matched its path.
UNMATCHED_ROUTE = "(none)"

# Every stage a sink may implement, as a method ``stage(self, state) -> None``.
STAGES = (
    "request_received",
    "attempt_started",
    "attempt_finished",
    "retry_scheduled",
    "repaired_retry",
    "repair_started",
    "payload_repaired",
    "repair_result",
    "repair_refused",
    "repair_finished",
    "llm_request",
    "llm_reask",
    "schema_unavailable",
    "budget_exhausted",
    "sidecar_overloaded",
    "circuit_state",
    "circuit_refused",
    "request_finished",
    "state_error",
)


@dataclass(slots=True)
class LlmCall:
    """One call to the repair LLM, as it ended."""

    result: str  # ok, error, timeout or invalid
    duration_s: float
    input_tokens: int
    output_tokens: int
    failure: BaseException | None


@dataclass(slots=True)
class RequestState:
    """One request as its stages unfold: what it is, and the facts of the stage now running.

    Stage facts stay until the next stage of the same kind overwrites them (like tenacity's
    ``RetryCallState``); a sink reads them only in the stage that set them.
    """

    route: str
    method: str = ""
    # The agent's request headers, for sinks that continue the agent's trace.
    incoming: Mapping[str, str] | None = None
    # The attempt: its number, status code or error kind, duration and envelope.
    attempt: int = 0
    label: str = ""
    attempt_s: float = 0.0
    failure: ToolFailure | None = None
    # Why a retry follows, a repair was refused, or the sidecar had no room.
    reason: str = ""
    wait: Wait | None = None
    # A repair: its layer, the fields it changed (names only) and its result.
    layer: str = ""
    changed: Sequence[str] = ()
    result: str = ""
    llm: LlmCall | None = None
    circuit: int = 0
    # How the request ended.
    outcome: str = ""
    status: int = 0
    attempts: int = 0
    trail: str = ""
    duration_s: float = 0.0
    matched: bool = True
    # Labels a sink offers to link a measurement to (a sampled span's trace id).
    exemplar: dict[str, str] | None = None
    scratch: dict[str, Any] = field(default_factory=dict)


class Sink:
    """Something that records stages: define a method per stage of interest (see STAGES).

    ``flush`` and ``close`` run off the event loop (they may block on exporting).
    """

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


# The state of the request the running task serves: the pipeline's deeper layers (repairs,
# the LLM) report stages without carrying the state through their own signatures.
_current: ContextVar[RequestState | None] = ContextVar("sidecar_request_state", default=None)

_Request = TypeVar("_Request")


class Hooks:
    """The stage-by-stage contract between the pipeline and its sinks. One per app."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = tuple(sinks)
        self._by_stage: dict[str, tuple[Callable[[RequestState], Any], ...]] = {
            stage: tuple(
                getattr(sink, stage) for sink in self.sinks if callable(getattr(sink, stage, None))
            )
            for stage in STAGES
        }

    def _emit(self, stage: str, state: RequestState) -> None:
        for record in self._by_stage[stage]:
            record(state)

    def _state(self, route: str | None) -> RequestState:
        """The running request's state, or a detached one for a stage outside any request."""
        state = _current.get()
        if state is None or state.route != route:
            return RequestState(route or "")
        return state

    def request_received(
        self, route: str, method: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """A request was matched to ``route``: it is now in flight."""
        state = RequestState(route, method, headers)
        _current.set(state)
        self._emit("request_received", state)

    def attempt_started(self, attempt: int, request: _Request) -> _Request:
        """Attempt ``attempt`` is about to be sent: ``request`` as it must go upstream.

        A sink may set headers on the attempt (``state.scratch["upstream_headers"]``), such
        as its trace context; with none, the request goes exactly as given.
        """
        state = self._state(_current_route())
        state.attempt = attempt
        self._emit("attempt_started", state)
        headers = state.scratch.pop("upstream_headers", None)
        if not headers:
            return request
        merged = request.headers.copy()  # type: ignore[attr-defined]
        for name, value in headers.items():
            merged[name] = value
        return replace(request, headers=merged)  # type: ignore[type-var]

    def attempt_finished(
        self,
        route: str,
        attempt: int,
        label: str,
        duration_s: float,
        failure: ToolFailure | None,
    ) -> None:
        """One upstream attempt ended; ``label`` is its status code or its error kind."""
        state = self._state(route)
        state.attempt, state.label, state.attempt_s = attempt, label, duration_s
        state.failure = failure
        self._emit("attempt_finished", state)

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
        state = self._state(route)
        state.attempt, state.label, state.reason, state.wait = attempt, label, reason, wait
        state.failure = failure
        self._emit("retry_scheduled", state)

    def repaired_retry(self, route: str, attempt: int, label: str, layer: str) -> None:
        """A repaired payload will be sent right away after attempt ``attempt``."""
        state = self._state(route)
        state.attempt, state.label, state.layer, state.reason = attempt, label, layer, "repaired"
        self._emit("repaired_retry", state)

    def repair_started(self, route: str) -> None:
        """The repair layers are asked for a new payload after a failed attempt."""
        self._emit("repair_started", self._state(route))

    def repair_finished(self, route: str, layer: str | None) -> None:
        """The repair layers answered: ``layer`` made a new payload, or (``None``) none did."""
        state = self._state(route)
        state.layer = layer or ""
        self._emit("repair_finished", state)

    def payload_repaired(self, route: str, layer: str, fields: list[str]) -> None:
        """A layer changed these fields of the payload (their values are never recorded)."""
        state = self._state(route)
        state.layer, state.changed = layer, fields
        self._emit("payload_repaired", state)

    def repair_result(self, route: str, layer: str, result: str) -> None:
        """A layer's work ended: ``succeeded``/``failed`` (its payload's answer), ``declined``."""
        state = self._state(route)
        state.layer, state.result = layer, result
        self._emit("repair_result", state)

    def repair_refused(self, route: str, layer: str, why: str) -> None:
        """A layer's proposal broke a guardrail and was not sent."""
        state = self._state(route)
        state.layer, state.reason = layer, why
        self._emit("repair_refused", state)

    def llm_request(
        self,
        result: str,
        duration_s: float,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        failure: BaseException | None = None,
    ) -> None:
        """One call to the LLM ended: ``ok``, ``error``, ``timeout`` or ``invalid``."""
        state = self._state(_current_route())
        state.llm = LlmCall(result, duration_s, prompt_tokens, completion_tokens, failure)
        self._emit("llm_request", state)

    def llm_reask(self, route: str, reason: str) -> None:
        """The model's answer was refused for ``reason`` (a kind); it is asked again, told why."""
        state = self._state(route)
        state.layer, state.reason = "llm", reason
        self._emit("llm_reask", state)

    def schema_unavailable(self, route: str, reason: str) -> None:
        """A route's schema could not be loaded; the route runs without (or with the last)."""
        state = RequestState(route, reason=reason)
        self._emit("schema_unavailable", state)

    def budget_exhausted(self, route: str) -> None:
        """A retry was refused: the route's retry budget is spent."""
        self._emit("budget_exhausted", self._state(route))

    def sidecar_overloaded(self, route: str | None, reason: str) -> None:
        """The sidecar itself had no room for a call: ``max_in_flight``, ``pool_timeout``
        (no free upstream connection) or ``fd_exhausted``."""
        state = self._state(route)
        state.reason = reason
        self._emit("sidecar_overloaded", state)

    def circuit_state(self, route: str, state_now: int) -> None:
        """The route's circuit breaker is in ``state_now`` (0 closed, 1 half-open, 2 open)."""
        state = self._state(route)
        state.circuit = state_now
        self._emit("circuit_state", state)

    def circuit_refused(self, route: str) -> None:
        """The route's open circuit refused a request without trying the tool."""
        self._emit("circuit_refused", self._state(route))

    def state_error(self, op: str, error: BaseException) -> None:
        """A call to the fleet state store failed; the request went on with local state.
        Not a stage of any request: its facts are ``op`` (``reason``) and the error's class
        (``label``)."""
        self._emit("state_error", RequestState("", reason=op, label=type(error).__name__))

    def request_finished(
        self,
        route: str,
        method: str,
        outcome: str,
        status: int,
        attempts: int,
        duration_s: float,
        *,
        trail: str = "",
        matched: bool = True,
    ) -> None:
        """The answer's headers went to the agent (or the agent went away)."""
        state = self._state(route) if matched else RequestState(route, method)
        state.method, state.outcome, state.status = method, outcome, status
        state.attempts, state.duration_s, state.trail = attempts, duration_s, trail
        state.matched = matched
        self._emit("request_finished", state)
        if matched:
            _current.set(None)

    def flush(self) -> None:
        """Every sink's buffered records sent on (blocking: call it off the event loop)."""
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        """Every sink flushed and stopped (blocking: call it off the event loop)."""
        for sink in self.sinks:
            sink.close()


def _current_route() -> str | None:
    state = _current.get()
    return state.route if state is not None else None
