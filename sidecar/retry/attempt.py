"""One attempt's answer judged: the record the retry machine reasons about.

Pure, and called by the machine: the answer is read through ``Held``, and the wall clock
(for a ``Retry-After`` date) is the machine's, injected. Besides the verdict, three rules
live here because they are about what the answer is: a body too slow to read ends the
request with the answer as it is (sending again could run the call twice), a protocol
version probe refused with a 4xx got its answer, and a ``tools/list`` result teaches the
route which tools are safe to repeat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sidecar.outcomes import AttemptError, NoAnswer
from sidecar.retry.classify import Action, Verdict, classify
from sidecar.retry.replay import McpToolHints
from sidecar.retry.steps import A, Attempt, Send, Terms
from sidecar.retry.waits import requested_wait
from sidecar.tool.envelopes import Reply, inspect
from sidecar.tool.mesh import lost_after_delivery


def judge(
    copy: Send,
    result: A | NoAnswer,
    terms: Terms,
    tools: McpToolHints | None,
    wall: Callable[[], float],
) -> tuple[Attempt, A | None]:
    """Read one attempt's answer (its envelope, when its body was read) into a verdict; the
    record, and the tool's answer when there is one. ``tools`` learns which tools a
    relayed ``tools/list`` result marks safe to repeat; ``wall`` is the Unix time."""
    retry_on_status = terms.retry_on_status
    if isinstance(result, NoAnswer):
        error = result.error
        verdict = classify(error, retry_on_status)
        return Attempt(copy, error.value, verdict, error=error, error_reason=result.reason), None
    if result.broken:
        # Its event stream broke after an event with an id and was not resumed: a reset
        # after delivery, sent again only when safe to; else what was read goes to the
        # agent, whose client resumes it.
        error = AttemptError.RESET
        verdict = classify(error, retry_on_status)
        return Attempt(copy, error.value, verdict, error=error, resumed=result.resumed), result
    status = result.status
    failure, text = inspect(status, *result.judged()) if result.decisive else (None, "")
    headers = result.headers
    lost = lost_after_delivery(status, headers, text, tool_envelope=failure is not None)
    reply = Reply(status, failure, text, lost)
    verdict = classify(reply, retry_on_status)
    if terms.probe and 400 <= status < 500 and status not in _NOT_AN_ANSWER_TO_A_PROBE:
        verdict = _PROBE_ANSWERED
    if result.slow:
        # The tool answered; only its body is slow. Sending the call again could run
        # it twice, so this answer is the one the agent gets.
        verdict = replace(verdict, action=Action.DONE)
    if verdict.success:
        if tools is not None:
            tools.learn(result.document())
        attempt = Attempt(
            copy, str(status), verdict, reply, slow_body=result.slow, resumed=result.resumed
        )
        return attempt, result
    # A header's wait (``Retry-After``, ``RateLimit-Reset``) is the tool's word on the whole
    # tool (the whole route, in the ``route`` circuit scope); a wait in the envelope answers
    # this call, so it holds for its path.
    now = wall()
    requested_s, path_scoped = requested_wait(headers, None, now), False
    if requested_s is None and failure is not None:
        requested_s, path_scoped = requested_wait({}, failure, now), True
    attempt = Attempt(
        copy,
        str(status),
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
