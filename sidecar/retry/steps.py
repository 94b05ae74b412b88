"""What the retry machine takes in and gives out: the attempt records, the commands it
gives the engine, the reports it leaves in its outbox, the result that ends a request's
life, and the terms that bound it.

Named tuples: immutable once made, and made at a tuple's cost (an attempt's records are
made on every request's path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from sidecar.outcomes import AttemptError, Outcome, Wait
from sidecar.repair.payload import Payload
from sidecar.retry.classify import Verdict
from sidecar.retry.policy import Backoff, Limits
from sidecar.tool.envelopes import Reply, ToolFailure


class Held(Protocol):
    """The tool's answer as the machine judges and holds it: what was read of it, whole or
    still streaming, and droppable. The transport's ``Answer`` is one."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def complete(self) -> bool: ...

    @property
    def decisive(self) -> bool: ...

    @property
    def slow(self) -> bool: ...

    @property
    def broken(self) -> bool: ...

    @property
    def resumed(self) -> bool: ...

    def judged(self) -> tuple[bytes, str | None]: ...

    def document(self) -> Any: ...

    def discard(self) -> None: ...


A = TypeVar("A", bound=Held)


def seconds_token(value: float) -> str:
    """Short seconds for the trail, three significant digits: ``0.8s``, ``2s``, ``0.0163s``."""
    return f"{value:.3g}s"


class Send(NamedTuple):
    """Send the request as attempt ``number`` — the action, and the copy's record."""

    number: int
    started: float  # on the machine's clock
    per_try_s: float  # its timeout until the answer's head
    hedge: bool = False  # a copy of the attempt before it, which is still waiting


class Attempt(NamedTuple):
    """One attempt's answer, judged: what the machine reasons about."""

    copy: Send
    label: str  # the status, or the ``AttemptError``'s value (in metrics, logs and the trail)
    verdict: Verdict
    reply: Reply | None = None  # the answer's status and envelope, when it answered
    error: AttemptError | None = None  # else what it ran into
    error_reason: str | None = None  # why an answer was refused as malformed
    requested_s: float | None = None  # the wait the tool asked for
    path_scoped: bool = False  # ... for the called path only (its envelope said so)
    slow_body: bool = False  # the body did not come within the inspection window
    resumed: bool = False  # its event stream broke and was resumed (``Last-Event-ID``)

    @property
    def trail_label(self) -> str:
        """Its token in the trail: the label, and whether its stream was resumed."""
        return f"{self.label} resumed" if self.resumed else self.label

    @property
    def failure(self) -> ToolFailure | None:
        return self.reply.failure if self.reply is not None else None

    @property
    def stopped_outcome(self) -> Outcome:
        """The outcome when retries end before their limit because of the tool's state."""
        error = self.error
        return Outcome.UNREACHABLE if error and error.not_connected else Outcome.EXHAUSTED


# The three ways a life ends: a tagged union the proxy matches on.


class Relayed(NamedTuple, Generic[A]):
    """The tool's last real answer goes back."""

    outcome: Outcome
    attempts: int
    trail: tuple[str, ...]
    answer: A
    repaired: tuple[str, ...] = ()  # the layers that changed the body behind ``answer``


class Unanswered(NamedTuple):
    """No answer of the tool's to give: the sidecar says what the last attempt ran into."""

    outcome: Outcome
    attempts: int
    trail: tuple[str, ...]
    error: AttemptError
    reason: str | None = None  # in more words, when there are more to say


class Paused(NamedTuple):
    """The tool is not to be called for ``open_for_s``: its circuit is open, or the fleet's
    cooldown outlasts the request, and no answer of its own is left to give."""

    outcome: Outcome
    attempts: int
    trail: tuple[str, ...]
    open_for_s: float
    tool: str  # whose circuit or cooldown it is ("": the whole route)


Result = Relayed[A] | Unanswered | Paused


# Commands besides ``Send`` and the results: each is answered by one event.


class SendHedged(NamedTuple):
    """Send ``first``; when no answer's head came after ``after_s``, ask ``hedge_due``."""

    first: Send
    after_s: float


class WaitCooldown(NamedTuple):
    """Wait out the fleet's cooldown of the tool, then read it again."""

    seconds: float


class WaitRetry(NamedTuple):
    """Wait, then send the same payload again."""

    wait: Wait
    attempts: int  # made so far
    label: str  # the last attempt's
    reason: str
    failure: ToolFailure | None


class Prepare(NamedTuple):
    """Before the first attempt: coerce the agent's payload, put the idempotency key on
    (``prepared`` with the payload that goes)."""


class ReadCooldown(NamedTuple):
    """Read the fleet's cooldown of the tool (``cooldown_read`` with what it says)."""


class Repair(NamedTuple):
    """Ask the repair layers for a better payload than ``payload`` (``repaired``)."""

    reply: Reply  # the failed attempt's answer
    attempts: int  # made so far
    payload: Payload
    tried: frozenset[str]  # the fingerprints of the payloads sent so far
    llm_repairs_left: int
    time_left_s: float


class ReopenSession(NamedTuple):
    """Open the MCP session the server forgot again, within ``time_left_s`` (the request's
    deadline), and say whether it was (``reopened``)."""

    time_left_s: float


class Settle(NamedTuple):
    """Count the request's verdict in the circuit (``settled`` for the result)."""

    failed: bool


PREPARE = Prepare()
READ_COOLDOWN = ReadCooldown()
SETTLE_FAILED, SETTLE_OK = Settle(True), Settle(False)

Command = (
    Send
    | SendHedged
    | WaitCooldown
    | WaitRetry
    | Prepare
    | ReadCooldown
    | Repair
    | ReopenSession
    | Settle
    | Relayed[A]
    | Unanswered
    | Paused
)


# Reports: what the machine tells, in its outbox, with no answer owed. The engine carries
# them out, in order, before the command that follows them.


class AttemptJudged(NamedTuple):
    """An attempt ended, judged, ``elapsed_s`` after it was sent."""

    attempt: Attempt
    elapsed_s: float


class UsePayload(NamedTuple):
    """The repaired ``payload`` is the body of the next attempts (a new payload, a new key)."""

    payload: Payload
    layer: str
    attempts: int  # made so far
    label: str  # the attempt it repairs


class RepairJudged(NamedTuple):
    """The attempt that carried ``layer``'s payload succeeded or failed."""

    layer: str
    result: str  # "succeeded" or "failed"


class ShareCooldown(NamedTuple):
    """Tell the fleet the wait the tool asked for: the whole tool's, or ``path``'s."""

    seconds: float
    path: str | None


class ReportBudgetExhausted(NamedTuple):
    """The route's retry budget stopped a retry."""


class ReportCircuitRefused(NamedTuple):
    """The circuit refused the request before any attempt."""


BUDGET_EXHAUSTED = ReportBudgetExhausted()
CIRCUIT_REFUSED = ReportCircuitRefused()

Report = (
    AttemptJudged
    | UsePayload
    | RepairJudged
    | ShareCooldown
    | ReportBudgetExhausted
    | ReportCircuitRefused
)


class Terms(NamedTuple):
    """What a request's life is bound by, read once before it starts."""

    limits: Limits
    backoff: Backoff
    deadline: float  # the whole request's, on the machine's clock: every attempt ends by it
    retry_until: float  # the retry window's end: no retry's wait or attempt outlasts it
    per_try_s: float  # the configured per-try timeout
    safe_to_repeat: bool  # the call may run twice at the tool without harm
    replay_always: bool  # ``replay_delivered: always``: sent again once delivered, even so
    hedge_after_s: float  # when a copy goes, for a call safe to repeat; 0: never
    llm_max_repairs: int
    tool: str  # whose circuit and cooldowns the call goes by
    path: str  # the called path, for a cooldown the tool scoped to it
    shares_cooldowns: bool  # the fleet keeps the tool's cooldowns
    retry_on_status: frozenset[int]  # the statuses retried whatever the body says
    # A protocol version probe: a 4xx is its answer, not the tool's failure.
    probe: bool = False
    # An MCP request on a session the sidecar may open again when the server forgot it.
    session_reopenable: bool = False
