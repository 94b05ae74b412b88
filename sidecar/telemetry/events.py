"""The telemetry events of a request: one frozen dataclass per event, the registry of them
all (``ALL_EVENTS``), and ``Request``, the small record a request's events share.

``Hooks`` (``telemetry.contract``) makes one event per call of the pipeline and hands it to
each sink's method of the event's ``name``. An event carries every fact of its moment a
sink reads; an event that may belong to the request in flight carries that request's
record as ``request`` (``None`` when it belongs to none, or to another route).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sidecar.outcomes import Wait
from sidecar.tool.envelopes import ToolFailure

# Every event by name, filled as the classes below are defined: a sink's handler methods
# are checked against it when the sink is registered.
ALL_EVENTS: dict[str, type[Event]] = {}


class Event:
    """One thing that happened; a subclass's ``name`` (its hook's and its handlers' name) is
    its class name in snake case, or the ``hook_name`` it sets."""

    __slots__ = ()
    name: ClassVar[str]
    hook_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # ``dataclass(slots=True)`` defines the class anew: the last definition stays.
        cls.name = cls.hook_name or re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        ALL_EVENTS[cls.name] = cls


@dataclass(slots=True, eq=False)
class Request:
    """The request in flight, from ``RequestReceived`` to ``RequestFinished``: what the
    pipeline said of it so far. ``Hooks`` keeps it; sinks only read it, and key what they
    keep of a request by it (it is hashed by identity)."""

    route: str
    method: str
    # The latest attempt started or finished.
    attempt: int = 0
    # Each repair layer that changed the payload, with the names of the fields it changed.
    repairs: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestReceived(Event):
    """A request was matched to ``route``: it is now in flight. ``headers`` are the agent's,
    for a sink that continues the agent's trace."""

    route: str
    method: str
    headers: Mapping[str, str] | None
    request: Request


@dataclass(frozen=True, slots=True)
class AttemptStarted(Event):
    """Attempt ``attempt`` is about to be sent upstream. A ``hedge`` goes while the attempt
    before it is still waiting for its answer."""

    attempt: int
    request: Request | None
    hedge: bool = False


@dataclass(frozen=True, slots=True)
class AttemptFinished(Event):
    """One upstream attempt ended; ``label`` is its status code or its error kind, and
    ``failure`` what the tool's envelope said went wrong."""

    route: str
    attempt: int
    label: str
    duration_s: float
    failure: ToolFailure | None
    request: Request | None
    # Labels to link the measurement to (the attempt's span's ids, when it is sampled).
    exemplar: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class RetryScheduled(Event):
    """A retry will follow attempt ``attempt`` after ``wait``, for ``reason``."""

    route: str
    attempt: int
    label: str
    reason: str
    wait: Wait
    failure: ToolFailure | None
    request: Request | None


@dataclass(frozen=True, slots=True)
class RepairedRetry(Event):
    """A payload repaired by ``layer`` will be sent right away after attempt ``attempt``."""

    route: str
    attempt: int
    label: str
    layer: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class RepairStarted(Event):
    """The repair layers are asked for a new payload after attempt ``attempt`` failed."""

    route: str
    attempt: int
    request: Request | None


@dataclass(frozen=True, slots=True)
class PayloadRepaired(Event):
    """``layer`` changed these fields of the payload (names only: values are never
    recorded); coercion may do so before the first attempt."""

    route: str
    layer: str
    fields: Sequence[str]
    request: Request | None


@dataclass(frozen=True, slots=True)
class RepairResult(Event):
    """``layer``'s work ended: ``applied``, ``succeeded``/``failed`` (its payload's answer)
    or ``declined``."""

    route: str
    layer: str
    result: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class RepairRefused(Event):
    """``layer``'s proposal broke a guardrail (``reason``) and was not sent; ``fields``
    names the fields it touched out of scope (never their values)."""

    route: str
    layer: str
    reason: str
    request: Request | None
    fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RepairFinished(Event):
    """The repair layers answered: ``layer`` made a new payload, or (``""``) none did."""

    route: str
    layer: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class LlmCallFinished(Event):
    """One call to the repair LLM ended: ``ok``, ``error``, ``timeout`` or ``invalid``;
    ``failure`` is what ended a call that was not ``ok``, when something raised;
    ``response_format`` the form its answer was held to (``llm_format.FORMS``)."""

    result: str
    duration_s: float
    input_tokens: int
    output_tokens: int
    failure: BaseException | None
    response_format: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class LlmFormatRefused(Event):
    """The LLM endpoint refused the ``response_format`` form asked for with ``status``; it
    is not asked for that form again. Not part of any request's record."""

    response_format: str
    status: int


@dataclass(frozen=True, slots=True)
class LlmReask(Event):
    """The model's answer was refused for ``reason`` (a kind); it is asked again, told why."""

    route: str
    reason: str


@dataclass(frozen=True, slots=True)
class SchemaUnavailable(Event):
    """A route's schema could not be loaded; the route runs without (or with the last).
    Not part of any request."""

    route: str
    reason: str


@dataclass(frozen=True, slots=True)
class BudgetExhausted(Event):
    """A retry was refused: the route's retry budget is spent."""

    route: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class SessionReopened(Event):
    """An MCP session its server forgot was opened again (``opened``), or could not be."""

    route: str
    opened: bool
    request: Request | None


@dataclass(frozen=True, slots=True)
class SidecarOverloaded(Event):
    """The sidecar itself had no room for a call (``reason``: ``max_in_flight``,
    ``pool_timeout`` or ``fd_exhausted``); ``route`` is ``""`` when no route is known."""

    route: str
    reason: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class CircuitStateReported(Event):
    """The circuit breaker of the route's ``tool`` (``""``: the whole route's) is in
    ``state`` (0 closed, 1 half-open, 2 open): after it admitted a request or refused it,
    and after it recorded a request's verdict. Its hook keeps the name the retry engine
    calls (``circuit_state``); ``CircuitState`` is the breaker's own state
    (``retry/guards/circuit``)."""

    hook_name: ClassVar[str | None] = "circuit_state"
    route: str
    state: int
    tool: str = ""


@dataclass(frozen=True, slots=True)
class CircuitRefused(Event):
    """The open circuit of the route's ``tool`` refused a request without trying it."""

    route: str
    request: Request | None
    tool: str = ""


@dataclass(frozen=True, slots=True)
class HedgeFinished(Event):
    """A hedged attempt's race ended: the copy answered first (``won``), the attempt it
    copied did (``lost``), or neither answered (``unanswered``)."""

    route: str
    result: str
    request: Request | None


@dataclass(frozen=True, slots=True)
class StateError(Event):
    """A call (``op``) to the fleet state store failed; the request went on with local
    state. Not part of any request."""

    op: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class RequestFinished(Event):
    """The answer's headers went to the agent (or the agent went away). A request refused
    before it was received (no route matched, no room) is not ``matched``: it was never in
    flight."""

    route: str
    method: str
    path: str  # the agent's, without its query
    outcome: str
    status: int
    attempts: int
    duration_s: float
    trail: str
    matched: bool
    request: Request | None
    # Labels to link the measurement to (the request's span's ids, when it is sampled).
    exemplar: dict[str, str] | None = None
