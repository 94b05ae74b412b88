"""What can go wrong without an upstream answer, and how the sidecar says so.

An attempt ends in a response or in one ``AttemptError`` kind, never both::

    AttemptError
    ├── CONNECT  nothing reached the tool: refused, DNS, connect timeout
    ├── TIMEOUT  the per-try timeout (or the deadline) passed before the answer's headers
    └── RESET    the connection broke after the request was sent

When no upstream answer exists, the sidecar answers itself with a ``SidecarError``
in the GoMind ToolResponse envelope; its ``details`` values are strings and carry
``"source": "sidecar"`` so an agent can tell it from the tool's own words.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web


class AttemptError(enum.Enum):
    CONNECT = "connect_error"
    TIMEOUT = "timeout"
    RESET = "reset"


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

_ANSWER_FOR_ATTEMPT = {
    AttemptError.CONNECT: (UPSTREAM_UNREACHABLE, "could not connect to the tool"),
    AttemptError.TIMEOUT: (UPSTREAM_TIMEOUT, "the tool did not answer in time"),
    AttemptError.RESET: (UPSTREAM_RESET, "the tool closed the connection before answering"),
}


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
    return web.Response(
        status=error.status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers=headers,
    )


def attempt_error_response(
    error: AttemptError, headers: Mapping[str, str] | None = None
) -> web.Response:
    """The sidecar's answer when the last attempt produced no upstream answer."""
    sidecar_error, message = _ANSWER_FOR_ATTEMPT[error]
    return error_response(sidecar_error, message, {"reason": error.value}, headers)


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
