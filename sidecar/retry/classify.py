"""The decision matrix: one attempt's result in, a verdict out. Pure: no I/O, no clock."""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from sidecar.outcomes import AttemptError
from sidecar.tool.envelopes import CATEGORY_STATUS, Reply, ToolFailure
from sidecar.tool.validation import Finding, find


class Action(enum.Enum):
    DONE = "done"  # hand the answer to the agent
    RETRY = "retry"  # send the same payload again after a wait
    REPAIR = "repair"  # change the payload, then send it again


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    # Why: ``success``, ``server_error``, ``rate_limited``, ``connect_error``, ``reset``,
    # ``timeout``, ``validation``, ``retryable_envelope``, ``auth``, ``not_retryable``,
    # ``overloaded``, ``malformed``.
    reason: str
    # The tool looks unhealthy (no answer, or a status in RETRY_ON_STATUS that did not say
    # it must not be retried): what the circuit breaker counts.
    is_failure: bool = False
    # A RETRY of a request the tool may already be running: only when it is safe to repeat.
    only_if_safe: bool = False

    @property
    def success(self) -> bool:
        return self.reason == "success"


def classify(result: Reply | AttemptError, retry_on_status: Collection[int]) -> Verdict:
    """The contract's decision matrix for one attempt."""
    if isinstance(result, AttemptError):
        if result.local:
            return Verdict(Action.DONE, "overloaded")
        if result is AttemptError.MALFORMED:
            # The tool ran the call and answered; what it said cannot be passed on or
            # trusted, and asking again could run the call twice.
            return Verdict(Action.DONE, "malformed", is_failure=True)
        reason = _ERROR_REASON[result]
        return Verdict(Action.RETRY, reason, is_failure=True, only_if_safe=result.delivered)

    failure = result.failure
    status = result.status
    if 200 <= status < 300 and failure is not None:
        status = _status_for_envelope(failure)
    is_failure = status in retry_on_status

    if status < 400:
        return Verdict(Action.DONE, "success")
    if status in (401, 403):
        return Verdict(Action.DONE, "auth")
    if failure is not None and failure.retryable is False:
        return Verdict(Action.DONE, "not_retryable")
    if status == 429:
        return Verdict(Action.RETRY, "rate_limited")
    if failure is not None and failure.dialect == "jsonrpc" and status >= 500:
        # A JSON-RPC error means the server had the call; only its own word makes a repeat
        # welcome. ``data.retryable: true`` is that word, as an envelope's is for a 503: the
        # server says the call did not take effect, whatever its tool's annotations.
        if failure.retryable is True:
            return Verdict(Action.RETRY, "server_error", is_failure)
        return Verdict(Action.DONE, "not_retryable", is_failure=is_failure)
    if is_failure and result.lost_after_delivery:
        # A proxy beside the tool (Envoy, Linkerd) lost the call after it may have reached
        # the tool: a reset after delivery, on its connection rather than ours.
        return Verdict(Action.RETRY, "server_error", is_failure, only_if_safe=True)
    if is_failure:
        return Verdict(Action.RETRY, "server_error", is_failure=is_failure)
    if status < 500:
        if status in (400, 422):
            finding = find(failure.message if failure else "", result.text)
            if finding is Finding.IN_BODY:
                return Verdict(Action.REPAIR, "validation")
            if finding is Finding.OUTSIDE_BODY:  # no payload can fix a bad query or path
                return Verdict(Action.DONE, "not_retryable")
        if failure is not None and failure.retryable is True:
            return Verdict(Action.REPAIR, "retryable_envelope")
    return Verdict(Action.DONE, "not_retryable", is_failure=is_failure)


# ``connect_error``: nothing reached the tool; ``reset``: the call did, then the connection
# broke before its answer.
_ERROR_REASON = {
    AttemptError.CONNECT: "connect_error",
    AttemptError.CONNECT_TIMEOUT: "connect_error",
    AttemptError.TIMEOUT: "timeout",
    AttemptError.RESET: "reset",
}


def _status_for_envelope(failure: ToolFailure) -> int:
    """The status a 2xx failure envelope stands for, by its category."""
    if failure.category in CATEGORY_STATUS:
        return CATEGORY_STATUS[failure.category]
    return 503 if failure.retryable is True else 400
