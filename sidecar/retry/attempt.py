"""One attempt's answer read into the record the retry machine reasons about, and the
request each attempt sends."""

from __future__ import annotations

import time
from dataclasses import replace

from sidecar.ids import idempotency_key
from sidecar.outcomes import AttemptError
from sidecar.repair.payload import Payload
from sidecar.retry.classify import Action, Verdict, classify
from sidecar.retry.replay import McpToolHints
from sidecar.retry.steps import Attempt, Send
from sidecar.retry.waits import requested_wait
from sidecar.tool.envelopes import Reply, inspect
from sidecar.tool.mesh import lost_after_delivery
from sidecar.transport.exchange import Answer, Malformed, UpstreamRequest


def judge(
    copy: Send,
    result: Answer | AttemptError | Malformed,
    retry_on_status: frozenset[int],
    tools: McpToolHints | None = None,
    *,
    probe: bool = False,
) -> tuple[Attempt, Answer | None]:
    """Read one attempt's answer (its envelope, when its body was read) into a verdict; the
    record, and the tool's answer when there is one. ``tools`` learns which tools a
    relayed ``tools/list`` result marks safe to repeat; a ``probe`` of the protocol version
    refused with a 4xx got the answer it asked for."""
    if isinstance(result, Malformed):
        error = AttemptError.MALFORMED
        verdict = classify(error, retry_on_status)
        return Attempt(copy, error.value, verdict, error=error, error_reason=result.reason), None
    if isinstance(result, AttemptError):
        return Attempt(copy, result.value, classify(result, retry_on_status), error=result), None
    if result.broken:
        # Its event stream broke after an event with an id and was not resumed: a reset
        # after delivery, sent again only when safe to; else what was read goes to the
        # agent, whose client resumes it.
        error = AttemptError.RESET
        verdict = classify(error, retry_on_status)
        return Attempt(copy, error.value, verdict, error=error, resumed=result.resumed), result
    failure, text = inspect(result.status, *result.judged()) if result.decisive else (None, "")
    headers = result.response.headers
    lost = lost_after_delivery(result.status, headers, text, tool_envelope=failure is not None)
    reply = Reply(result.status, failure, text, lost)
    verdict = classify(reply, retry_on_status)
    if probe and 400 <= result.status < 500 and result.status not in _NOT_AN_ANSWER_TO_A_PROBE:
        verdict = _PROBE_ANSWERED
    if result.slow:
        # The tool answered; only its body is slow. Sending the call again could run
        # it twice, so this answer is the one the agent gets.
        verdict = replace(verdict, action=Action.DONE)
    if verdict.success:
        if tools is not None:
            tools.learn(result.document())
        attempt = Attempt(
            copy, str(result.status), verdict, reply, slow_body=result.slow, resumed=result.resumed
        )
        return attempt, result
    # A header's wait (``Retry-After``, ``RateLimit-Reset``) is the tool's word on the whole
    # tool (the whole route, in the ``route`` circuit scope); a wait in the envelope answers
    # this call, so it holds for its path.
    now = time.time()
    requested_s, path_scoped = requested_wait(headers, None, now), False
    if requested_s is None and failure is not None:
        requested_s, path_scoped = requested_wait({}, failure, now), True
    attempt = Attempt(
        copy,
        str(result.status),
        verdict,
        reply,
        None,
        None,
        requested_s,
        path_scoped,
        result.slow,
        result.resumed,
    )
    return attempt, result


# A probe refused for these was not told which revision to speak: the usual verdicts apply.
_NOT_AN_ANSWER_TO_A_PROBE = frozenset({401, 403, 429})
_PROBE_ANSWERED = Verdict(Action.DONE, "success")


def carrying(request: UpstreamRequest, payload: Payload | None, key_header: str) -> UpstreamRequest:
    """``request`` carrying ``payload`` (``None``: its body streams through as it is), under a
    fresh idempotency key when it is the sidecar's, and with the agent's ``Content-Length``
    restated when the payload's length differs.

    The sidecar's key names one payload: every retry of it carries the same key, and a
    repaired payload (a different request to the tool) gets a new one. A key the agent
    chose is the agent's to keep.
    """
    headers = request.headers
    length = str(len(payload.body)) if payload is not None else None
    restate_length = length is not None and headers.get("Content-Length", length) != length
    if key_header or restate_length:
        headers = headers.copy()
    if key_header:
        headers[key_header] = idempotency_key()
    if restate_length:
        headers["Content-Length"] = str(length)
    if payload is None:
        return replace(request, headers=headers) if key_header else request
    return replace(request, headers=headers, body=payload.body)
