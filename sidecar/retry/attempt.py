"""One attempt as the retry loop reasons about it, and what a request's run comes to."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sidecar.ids import idempotency_key
from sidecar.outcomes import AttemptError, Outcome
from sidecar.repair.payload import Payload
from sidecar.retry.classify import Action, Verdict, classify
from sidecar.tool.envelopes import Reply, inspect
from sidecar.tool.mesh import lost_after_delivery
from sidecar.transport.exchange import Answer, Malformed, UpstreamRequest


@dataclass(slots=True)
class Result:
    """What goes back to the agent, and how it came to be."""

    outcome: Outcome
    attempts: int
    trail: list[str]
    answer: Answer | None = None  # the tool's last real answer, when one exists
    error: AttemptError | None = None  # else: what the last attempt ran into
    error_reason: str | None = None  # ... in more words, when there are more to say
    circuit_open_for_s: float | None = None  # else: the circuit refused to try at all
    tool: str = ""  # ... the tool whose circuit or cooldown it was ("": the whole route)
    repaired: tuple[str, ...] = ()  # the layers that changed the body behind ``answer``


@dataclass(slots=True)
class Attempt:
    """One attempt's result as the loop reasons about it."""

    result: Answer | AttemptError
    verdict: Verdict
    reply: Reply | None = None
    label: str = field(init=False)
    cut_by_deadline: bool = False  # its timeout was the deadline's, not the per-try one
    requested_s: float | None = None  # the wait the tool asked for
    path_scoped: bool = False  # ... for the called path only (its envelope said so)
    error_reason: str | None = None  # why an answer was refused as malformed

    def __post_init__(self) -> None:
        result = self.result
        self.label = result.value if isinstance(result, AttemptError) else str(result.status)

    @property
    def stopped_outcome(self) -> Outcome:
        """The outcome when retries end before their limit because of the tool's state."""
        result = self.result
        if isinstance(result, AttemptError) and result.not_connected:
            return Outcome.UNREACHABLE
        return Outcome.EXHAUSTED


def judge(result: Answer | AttemptError | Malformed, retry_on_status: frozenset[int]) -> Attempt:
    """Read one attempt's answer (its envelope, when its body was read) into a verdict."""
    if isinstance(result, Malformed):
        error = AttemptError.MALFORMED
        return Attempt(error, classify(error, retry_on_status), error_reason=result.reason)
    if isinstance(result, AttemptError):
        return Attempt(result, classify(result, retry_on_status))
    failure, text = inspect(result.status, *result.judged()) if result.decisive else (None, "")
    headers = result.response.headers
    lost = lost_after_delivery(result.status, headers, text, tool_envelope=failure is not None)
    reply = Reply(result.status, failure, text, lost)
    verdict = classify(reply, retry_on_status)
    if result.slow:
        # The tool answered; only its body is slow. Sending the call again could run
        # it twice, so this answer is the one the agent gets.
        verdict = replace(verdict, action=Action.DONE)
    return Attempt(result, verdict, reply)


def carrying(request: UpstreamRequest, payload: Payload, key_header: str) -> UpstreamRequest:
    """``request`` carrying ``payload``, under a fresh idempotency key when it is the sidecar's,
    and with the agent's ``Content-Length`` restated when the payload's length differs.

    The sidecar's key names one payload: every retry of it carries the same key, and a
    repaired payload (a different request to the tool) gets a new one. A key the agent
    chose is the agent's to keep.
    """
    headers = request.headers
    length = str(len(payload.body))
    restate_length = "Content-Length" in headers and headers["Content-Length"] != length
    if key_header or restate_length:
        headers = headers.copy()
    if key_header:
        headers[key_header] = idempotency_key()
    if restate_length:
        headers["Content-Length"] = length
    return replace(request, headers=headers, body=payload.body)


def seconds_token(value: float) -> str:
    """Short seconds for the trail, three significant digits: ``0.8s``, ``2s``, ``0.0163s``."""
    return f"{value:.3g}s"
