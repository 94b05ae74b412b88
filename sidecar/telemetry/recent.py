"""The calls worth a look and each route's counts, kept for the admin port's live page.

Every request adds to a few plain integers of its route. Only a call that needed more
than one attempt or did not succeed is written down, in a ring of the last
``RECENT_CALLS``: the common call costs a dictionary look-up and two additions.

What is kept is what a person may see: the path without its query, the trail, the repair
layers and the names of the fields they changed; never a header, a payload or a value.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.outcomes import Outcome
from sidecar.telemetry.contract import Sink
from sidecar.telemetry.events import RequestFinished

RECENT_CALLS = 200
# A repair that changed thousands of fields is told by its first names.
MAX_FIELD_NAMES = 50


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One finished call worth a look."""

    number: int  # 1, 2, … in the order the calls finished
    finished_at: float  # seconds since the epoch
    route: str
    method: str
    path: str
    outcome: str
    status: int
    attempts: int
    duration_s: float
    trail: str
    repairs: tuple[tuple[str, tuple[str, ...]], ...]
    answered: bool  # the tool's own 4xx, relayed untouched (``tool_answered``)


@dataclass(slots=True)
class RouteCounts:
    """A route's finished calls since start: ``answered`` counts the tool's own 4xx that
    went to the agent untouched after one attempt (``tool_answered``), ``gave_up`` every
    other call that ended without a success (a spent limit, a refusal the sidecar tried to
    repair, the sidecar's own answer)."""

    calls: int = 0
    ok: int = 0
    recovered: int = 0
    answered: int = 0
    gave_up: int = 0


def tool_answered(event: RequestFinished) -> bool:
    """Whether a call ended in the tool's own 4xx, relayed untouched after its one attempt.

    That is the tool's answer to the call (an agent SDK's probe the server does not serve,
    a city it does not know), not a call the sidecar gave up on: nothing was waited for,
    retried or repaired, as the trail of the bare status says. Its metric outcome stays
    ``not-retryable``.
    """
    return (
        event.outcome == Outcome.NOT_RETRYABLE
        and event.attempts == 1
        and 400 <= event.status < 500
        and event.trail == str(event.status)
    )


class RecentCalls(Sink):
    """The counts of each route, and the last ``size`` calls that were not a first-attempt
    success, newest last."""

    def __init__(
        self, size: int = RECENT_CALLS, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.calls: deque[CallRecord] = deque(maxlen=size)
        self.counts: dict[str, RouteCounts] = {}
        self._wall_clock = wall_clock
        self._numbered = 0

    def request_finished(self, event: RequestFinished) -> None:
        counts = self.counts.get(event.route)
        if counts is None:
            counts = self.counts[event.route] = RouteCounts()
        counts.calls += 1
        if event.outcome == Outcome.OK:
            counts.ok += 1
            return
        answered = tool_answered(event)
        if event.outcome == Outcome.RECOVERED:
            counts.recovered += 1
        elif answered:
            counts.answered += 1
        else:
            counts.gave_up += 1
        self._numbered += 1
        repairs = event.request.repairs if event.request is not None else ()
        self.calls.append(
            CallRecord(
                self._numbered,
                self._wall_clock(),
                event.route,
                event.method,
                event.path,
                event.outcome,
                event.status,
                event.attempts,
                event.duration_s,
                event.trail,
                tuple((layer, fields[:MAX_FIELD_NAMES]) for layer, fields in repairs),
                answered,
            )
        )
