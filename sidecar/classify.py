"""The decision matrix: one attempt's result in, a verdict out. Pure: no I/O, no clock."""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from sidecar.envelopes import CATEGORY_STATUS, ToolFailure
from sidecar.errors import AttemptError
from sidecar.validation import Finding, find


class Action(enum.Enum):
    DONE = "done"  # hand the answer to the agent
    RETRY = "retry"  # send the same payload again after a wait
    REPAIR = "repair"  # change the payload, then send it again


@dataclass(frozen=True, slots=True)
class Reply:
    """What one attempt brought back, as far as deciding needs it."""

    status: int
    failure: ToolFailure | None = None
    text: str = ""  # the start of the (decoded) body, for plain-text validation errors


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    # Why: ``success``, ``server_error``, ``rate_limited``, ``connect_error``, ``timeout``,
    # ``validation``, ``retryable_envelope``, ``auth``, ``not_retryable``.
    reason: str
    # A connect error, a timeout or a status in RETRY_ON_STATUS: counts toward the circuit.
    is_failure: bool = False

    @property
    def success(self) -> bool:
        return self.reason == "success"


def classify(result: Reply | AttemptError, retry_on_status: Collection[int]) -> Verdict:
    """The contract's decision matrix for one attempt."""
    if isinstance(result, AttemptError):
        reason = "timeout" if result is AttemptError.TIMEOUT else "connect_error"
        return Verdict(Action.RETRY, reason, is_failure=True)

    failure = result.failure
    status = result.status
    if 200 <= status < 300 and failure is not None:
        status = _status_for_envelope(failure)
    is_failure = status in retry_on_status

    if status < 400:
        return Verdict(Action.DONE, "success")
    if status in (401, 403):
        return Verdict(Action.DONE, "auth", is_failure=is_failure)
    if failure is not None and failure.retryable is False:
        return Verdict(Action.DONE, "not_retryable", is_failure=is_failure)
    if status == 429:
        return Verdict(Action.RETRY, "rate_limited", is_failure=is_failure)
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


def _status_for_envelope(failure: ToolFailure) -> int:
    """The status a 2xx failure envelope stands for, by its category."""
    if failure.category in CATEGORY_STATUS:
        return CATEGORY_STATUS[failure.category]
    return 503 if failure.retryable is True else 400
