"""The answers the sidecar writes itself.

When no upstream answer exists, the sidecar answers in the GoMind ToolResponse envelope
(a ``SidecarError``); its ``details`` values are strings and carry ``"source":
"sidecar"`` so an agent can tell it from the tool's own words. Each is a ``AgentReply``, which
goes out with exactly the headers given plus what HTTP itself requires
(``agentwire.answer_head``). To a JSON-RPC request (an MCP client's) the same answer goes as
a JSON-RPC error for its id (``in_json_rpc``), which a client hands to the call that made it
instead of failing its transport.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from multidict import CIMultiDict

from sidecar.outcomes import GAVE_UP, AttemptError, Outcome
from sidecar.serve.agentwire import AgentReply


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

    def response(self, headers: Mapping[str, str] | None = None) -> AgentReply:
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
) -> AgentReply:
    """The sidecar's own answer in the ToolResponse envelope."""
    detail_strings = {key: str(value) for key, value in (details or {}).items()}
    detail_strings["source"] = "sidecar"
    answer_headers = CIMultiDict(headers or {})
    answer_headers["Content-Type"] = "application/json"
    body = {
        "success": False,
        "error": {
            "code": error.code,
            "message": message,
            "category": error.category,
            # The body says what the header says: once the sidecar gave up, sending the same
            # call again is not the agent's next step either.
            "retryable": error.retryable and answer_headers.get("x-should-retry") != "false",
            "details": detail_strings,
        },
    }
    return AgentReply(error.status, headers=answer_headers, body=orjson.dumps(body))


# JSON-RPC's "server error" range is the implementation's (-32000 to -32099): the sidecar's
# own answers take its first code, so a client tells them from the tool's.
SIDECAR_RPC_ERROR = -32000


def in_json_rpc(reply: AgentReply, rpc_id: bytes) -> AgentReply:
    """The sidecar's own envelope answer ``reply`` as a JSON-RPC error for the request whose
    id (as JSON text) is ``rpc_id``: status 200 and the envelope's facts in ``data``, with the
    status it stands for and any wait (``Retry-After``, which stays a header too).

    An MCP client reads a JSON-RPC error as the answer to that one call; an HTTP error
    status is, to most clients, a broken transport that ends the session. The report headers
    stay as they are."""
    envelope = orjson.loads(reply.body)["error"]
    data: dict[str, object] = {
        "status": reply.status,
        "code": envelope["code"],
        "category": envelope["category"],
        "retryable": envelope["retryable"],
        **envelope["details"],
    }
    retry_after = reply.headers.get("Retry-After")
    if retry_after is not None:
        data["retry_after_s"] = retry_after
    error = orjson.dumps({"code": SIDECAR_RPC_ERROR, "message": envelope["message"], "data": data})
    body = b'{"jsonrpc":"2.0","id":' + rpc_id + b',"error":' + error + b"}"
    answer = AgentReply(200, headers=CIMultiDict(reply.headers), body=body)
    answer.keep_alive = reply.keep_alive
    return answer


def attempt_error_response(
    error: AttemptError,
    headers: Mapping[str, str] | None = None,
    *,
    reason: str | None = None,
) -> AgentReply:
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


def overloaded_response(limit: int, headers: Mapping[str, str]) -> AgentReply:
    """The answer past ``SIDECAR_MAX_IN_FLIGHT``: try again shortly."""
    return error_response(
        SIDECAR_OVERLOADED,
        "the sidecar has as many requests in flight as it admits",
        {"max_in_flight": limit},
        {**headers, "Retry-After": OVERLOADED_RETRY_AFTER_S},
    )


def head_too_large(error: SidecarError) -> Refusal:
    """The refusal of a request line (``URI_TOO_LONG``) or header line over its limit."""
    if error is URI_TOO_LONG:
        return Refusal(error, "the request line is too long")
    return Refusal(error, "a header line of the request is too long")


def buffers_full() -> Refusal:
    """The refusal past ``SIDECAR_MAX_BUFFERED_BYTES``: a head or a body the sidecar has no
    room to hold."""
    return Refusal(SIDECAR_OVERLOADED, "the sidecar holds as many bytes in memory as it may")


def refusal_report(error: SidecarError) -> dict[str, str]:
    """``own_report``, with ``Retry-After`` when the refusal is the sidecar's saturation."""
    report = own_report(error)
    if error is SIDECAR_OVERLOADED:
        report["Retry-After"] = OVERLOADED_RETRY_AFTER_S
    return report


def shutdown_response(headers: Mapping[str, str]) -> AgentReply:
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
    open_for_s: float, tool: str = "", headers: Mapping[str, str] | None = None
) -> AgentReply:
    """The answer while a tool's circuit is open (``tool`` ``""``: the whole route's): try
    again when the probe is due."""
    retry_after = str(max(1, math.ceil(open_for_s)))
    details = {"retry_after_s": retry_after}
    if tool:
        details["tool"] = tool
    return error_response(
        CIRCUIT_OPEN,
        "the tool has been failing; calls are paused until a probe succeeds",
        details,
        {**(headers or {}), "Retry-After": retry_after},
    )


def report_headers(outcome: str, trail: str, *, attempts: int | None) -> dict[str, str]:
    """``X-Sidecar-Outcome`` and ``-Trail``, ``-Attempts`` when known, and the word that
    the agent's own client should not retry when the sidecar gave up."""
    report = {"X-Sidecar-Outcome": outcome, "X-Sidecar-Trail": trail}
    if attempts is not None:
        report["X-Sidecar-Attempts"] = str(attempts)
    if outcome in GAVE_UP:
        # The sidecar already retried what could be retried; the official OpenAI and
        # Anthropic SDKs read this header and do not add their own retries on top.
        report["x-should-retry"] = "false"
    return report


def own_report(error: SidecarError) -> dict[str, str]:
    """The report on an answer the sidecar made before any attempt: none made, and the
    error's code as the trail. Only a request refused as it stands is not worth repeating."""
    outcome = Outcome.OVERLOADED if error is SIDECAR_OVERLOADED else Outcome.NOT_RETRYABLE
    report = {
        "X-Sidecar-Attempts": "0",
        "X-Sidecar-Outcome": outcome,
        "X-Sidecar-Trail": error.code.lower(),
    }
    if not error.retryable:
        report["x-should-retry"] = "false"
    return report
