"""What can go wrong without an upstream answer, and how the sidecar says so.

An attempt ends in a response or in one ``AttemptError`` kind, never both. The kinds
say where the attempt stopped, because that decides whether it may be sent again::

    AttemptError
    ├── not delivered: nothing reached the tool, so a replay is always safe
    │   ├── CONNECT          refused, DNS, a connect that failed
    │   └── CONNECT_TIMEOUT  a connect that hung past the per-try timeout
    ├── delivered, no answer head: the tool may be working on it (see ``replay``)
    │   ├── TIMEOUT          the per-try timeout (or the deadline) passed first
    │   └── RESET            the connection broke first
    ├── delivered and answered, in bytes no one can pass on: never retried
    │   └── MALFORMED        not one unambiguous HTTP/1.1 answer (``transport.answer``)
    └── the sidecar's own saturation: never the tool's fault, never retried
        ├── POOL_TIMEOUT     no free connection in the sidecar's pool in time
        └── NO_FDS           the process is out of file descriptors

When no upstream answer exists, the sidecar answers itself with a ``SidecarError``
in the GoMind ToolResponse envelope; its ``details`` values are strings and carry
``"source": "sidecar"`` so an agent can tell it from the tool's own words.
"""

from __future__ import annotations

import enum
import errno
import math
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web

from sidecar.serve.respond import ExactResponse


class AttemptError(enum.Enum):
    """The value is the attempt's token in ``X-Sidecar-Trail``."""

    CONNECT = "connect_error"
    CONNECT_TIMEOUT = "connect_timeout"
    TIMEOUT = "timeout"
    RESET = "reset"
    POOL_TIMEOUT = "pool_timeout"
    NO_FDS = "fd_exhausted"
    MALFORMED = "malformed"

    @property
    def delivered(self) -> bool:
        """The request may have reached the tool (and may be running there)."""
        return self in (AttemptError.TIMEOUT, AttemptError.RESET)

    @property
    def local(self) -> bool:
        """The sidecar itself is saturated; the tool was never asked."""
        return self in (AttemptError.POOL_TIMEOUT, AttemptError.NO_FDS)


def out_of_descriptors(exc: object) -> bool:
    """Whether ``exc`` (an exception, or anything) says no file descriptor is left."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


class RequestTooLarge(Exception):
    """A streamed request body went past ``SIDECAR_MAX_REQUEST_BYTES``."""


@dataclass(frozen=True, slots=True)
class SidecarError:
    code: str
    status: int
    category: str
    retryable: bool


UPSTREAM_UNREACHABLE = SidecarError("UPSTREAM_UNREACHABLE", 503, "SERVICE_ERROR", True)
UPSTREAM_TIMEOUT = SidecarError("UPSTREAM_TIMEOUT", 504, "SERVICE_ERROR", True)
UPSTREAM_RESET = SidecarError("UPSTREAM_RESET", 502, "SERVICE_ERROR", True)
NO_ROUTE = SidecarError("NO_ROUTE", 404, "NOT_FOUND", False)
REQUEST_TOO_LARGE = SidecarError("REQUEST_TOO_LARGE", 413, "INPUT_ERROR", False)
SIDECAR_OVERLOADED = SidecarError("SIDECAR_OVERLOADED", 503, "SERVICE_ERROR", True)
CIRCUIT_OPEN = SidecarError("CIRCUIT_OPEN", 503, "SERVICE_ERROR", True)

CLIENT_TIMEOUT = SidecarError("CLIENT_TIMEOUT", 408, "INPUT_ERROR", True)
# The agent's request cannot be forwarded as it is.
BAD_REQUEST = SidecarError("BAD_REQUEST", 400, "INPUT_ERROR", False)
EXPECTATION_FAILED = SidecarError("EXPECTATION_FAILED", 417, "INPUT_ERROR", False)
URI_TOO_LONG = SidecarError("URI_TOO_LONG", 414, "INPUT_ERROR", False)
HEADERS_TOO_LARGE = SidecarError("HEADERS_TOO_LARGE", 431, "INPUT_ERROR", False)
# A fault of the sidecar's own: the request was not handled, whatever the tool would say.
SIDECAR_ERROR = SidecarError("SIDECAR_ERROR", 500, "SERVICE_ERROR", False)


class Refusal(Exception):
    """The sidecar answers the agent itself instead of asking the tool."""

    def __init__(
        self, error: SidecarError, message: str, details: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.details = details

    def response(self, headers: Mapping[str, str] | None = None) -> web.Response:
        return error_response(self.error, self.message, self.details, headers)


_ANSWER_FOR_ATTEMPT = {
    AttemptError.CONNECT: (UPSTREAM_UNREACHABLE, "could not connect to the tool"),
    AttemptError.CONNECT_TIMEOUT: (UPSTREAM_UNREACHABLE, "connecting to the tool timed out"),
    AttemptError.TIMEOUT: (UPSTREAM_TIMEOUT, "the tool did not answer in time"),
    AttemptError.RESET: (UPSTREAM_RESET, "the tool closed the connection before answering"),
    AttemptError.POOL_TIMEOUT: (
        SIDECAR_OVERLOADED,
        "no free upstream connection in the sidecar's pool in time",
    ),
    AttemptError.NO_FDS: (SIDECAR_OVERLOADED, "the sidecar is out of file descriptors"),
    AttemptError.MALFORMED: (
        UPSTREAM_RESET,
        "the tool's answer is not valid HTTP/1.1 and cannot be passed on",
    ),
}

# How long an agent refused for the sidecar's own saturation should wait.
OVERLOADED_RETRY_AFTER_S = "1"


def error_response(
    error: SidecarError,
    message: str,
    details: Mapping[str, object] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """The sidecar's own answer in the ToolResponse envelope."""
    detail_strings = {key: str(value) for key, value in (details or {}).items()}
    detail_strings["source"] = "sidecar"
    body = {
        "success": False,
        "error": {
            "code": error.code,
            "message": message,
            "category": error.category,
            "retryable": error.retryable,
            "details": detail_strings,
        },
    }
    return ExactResponse(
        status=error.status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers=headers,
    )


def attempt_error_response(
    error: AttemptError,
    headers: Mapping[str, str] | None = None,
    *,
    reason: str | None = None,
) -> web.Response:
    """The sidecar's answer when the last attempt produced no upstream answer.

    ``details.delivered`` is ``"maybe"`` when the request may have reached the tool: the
    agent, not the sidecar, decides whether to send it again.
    """
    sidecar_error, message = _ANSWER_FOR_ATTEMPT[error]
    details = {"reason": reason or error.value}
    if error.delivered:
        details["delivered"] = "maybe"
    elif error is AttemptError.MALFORMED:
        details["delivered"] = "yes"  # the tool got the call and answered it
    if error.local:
        headers = {**(headers or {}), "Retry-After": OVERLOADED_RETRY_AFTER_S}
    return error_response(sidecar_error, message, details, headers)


def overloaded_response(limit: int, headers: Mapping[str, str]) -> web.Response:
    """The answer past ``SIDECAR_MAX_IN_FLIGHT``: try again shortly."""
    return error_response(
        SIDECAR_OVERLOADED,
        "the sidecar has as many requests in flight as it admits",
        {"max_in_flight": limit},
        {**headers, "Retry-After": OVERLOADED_RETRY_AFTER_S},
    )


def shutdown_response(headers: Mapping[str, str]) -> web.Response:
    """The answer to a request still waiting for the tool when the drain time ran out."""
    response = error_response(
        UPSTREAM_TIMEOUT,
        "the sidecar is shutting down and the tool had not answered",
        {"reason": "shutdown"},
        headers,
    )
    response.force_close()
    return response


def circuit_open_response(
    open_for_s: float, headers: Mapping[str, str] | None = None
) -> web.Response:
    """The answer while a route's circuit is open: try again when the probe is due."""
    retry_after = str(max(1, math.ceil(open_for_s)))
    return error_response(
        CIRCUIT_OPEN,
        "the tool has been failing; calls are paused until a probe succeeds",
        {"retry_after_s": retry_after},
        {**(headers or {}), "Retry-After": retry_after},
    )
