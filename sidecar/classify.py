"""The decision matrix: one attempt's result in, a verdict out. Pure: no I/O, no clock."""

from __future__ import annotations

import enum
import re
from collections.abc import Collection
from dataclasses import dataclass

from sidecar.envelopes import CATEGORY_STATUS, ToolFailure
from sidecar.errors import AttemptError


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
    # ``validation``, ``retryable_envelope``, ``auth``, ``not_retryable``, ``overloaded``.
    reason: str
    # The tool looks unhealthy (no answer, or a status in RETRY_ON_STATUS that did not say
    # it must not be retried): what the circuit breaker counts.
    is_failure: bool = False
    # A RETRY of a request the tool may already be running: only when it is safe to repeat.
    only_if_safe: bool = False

    @property
    def success(self) -> bool:
        return self.reason == "success"


# Type and validation errors that a changed payload can fix: Go's encoding/json, pydantic
# and FastAPI, JSON Schema validators and the common hand-written phrasings.
VALIDATION_ERROR = re.compile(
    r"cannot unmarshal|type mismatch|invalid type|wrong type|must be (?:a|an|of type)\b"
    r"|must be (?:greater|less|at least|at most|between|one of)|is required|required field"
    r"|missing required|field required|is not valid under|is not of type|expected (?:a |an )?"
    r"(?:string|number|integer|int|float|bool|boolean|object|array)|invalid (?:value|format)"
    r"|\"type\":\s*\"(?:int|float|bool|string|missing|value|greater|less)[a-z_]*\"",
    re.IGNORECASE,
)


def classify(result: Reply | AttemptError, retry_on_status: Collection[int]) -> Verdict:
    """The contract's decision matrix for one attempt."""
    if isinstance(result, AttemptError):
        if result.local:
            return Verdict(Action.DONE, "overloaded")
        reason = "timeout" if result is AttemptError.TIMEOUT else "connect_error"
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
        # A JSON-RPC error means the server ran the call; only its own word makes a
        # repeat welcome, and even then only for a call that is safe to repeat.
        if failure.retryable is True:
            return Verdict(Action.RETRY, "server_error", is_failure, only_if_safe=True)
        return Verdict(Action.DONE, "not_retryable", is_failure=is_failure)
    if is_failure:
        return Verdict(Action.RETRY, "server_error", is_failure=is_failure)
    if status < 500:
        if status in (400, 422) and _shows_validation_error(result):
            return Verdict(Action.REPAIR, "validation")
        if failure is not None and failure.retryable is True:
            return Verdict(Action.REPAIR, "retryable_envelope")
    return Verdict(Action.DONE, "not_retryable", is_failure=is_failure)


def _status_for_envelope(failure: ToolFailure) -> int:
    """The status a 2xx failure envelope stands for, by its category."""
    if failure.category in CATEGORY_STATUS:
        return CATEGORY_STATUS[failure.category]
    return 503 if failure.retryable is True else 400


def _shows_validation_error(reply: Reply) -> bool:
    if reply.failure is not None and VALIDATION_ERROR.search(reply.failure.message):
        return True
    return bool(VALIDATION_ERROR.search(reply.text))
