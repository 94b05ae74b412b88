"""What ``/ui/state.json`` answers: each route's counts, call rate and guards, and the
recent calls worth a look, newest first.

Built only when the page asks, from the ``RecentCalls`` sink's counts and ring and from a
``snapshot`` of each route's guards. Every path passes the credential mask on its way out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.credentials import mask_path
from sidecar.retry.guards.route import RouteGuards
from sidecar.retry.guards.snapshot import snapshot
from sidecar.telemetry.recent import CallRecord, RecentCalls, RouteCounts

# Calls per second are counted over about this long.
RATE_WINDOW_S = 10.0
# However many pages poll, the call counts are sampled at most this often.
SAMPLE_EVERY_S = 0.5


class LiveState:
    """The page's state, read from ``recent`` and from the guards ``guards()`` returns."""

    def __init__(
        self,
        recent: RecentCalls,
        guards: Callable[[], Mapping[str, RouteGuards]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recent = recent
        self._guards = guards
        self._clock = clock
        # (when, calls by route): the counts as they were, to tell a rate from.
        self._samples: deque[tuple[float, dict[str, int]]] = deque([(clock(), {})])

    def document(self) -> dict[str, Any]:
        """The state as JSON-ready data."""
        guards = self._guards()
        counts = self._recent.counts
        rates = self._rates()
        names = [*guards, *(name for name in counts if name not in guards)]
        return {
            "routes": [
                _route(name, counts.get(name), guards.get(name), rates.get(name, 0.0))
                for name in names
            ],
            "calls": [_call(record) for record in reversed(self._recent.calls)],
        }

    def _rates(self) -> dict[str, float]:
        """Calls per second of each route, over the last ``RATE_WINDOW_S`` (or since the
        oldest sample, when the page has not looked for that long)."""
        now = self._clock()
        totals = {name: counts.calls for name, counts in self._recent.counts.items()}
        samples = self._samples
        if now - samples[-1][0] >= SAMPLE_EVERY_S:
            samples.append((now, totals))
        while len(samples) > 1 and now - samples[1][0] >= RATE_WINDOW_S:
            samples.popleft()
        then, before = samples[0]
        if now <= then:
            return {}
        return {
            name: (total - before.get(name, 0)) / (now - then) for name, total in totals.items()
        }


def _route(
    name: str, counts: RouteCounts | None, guards: RouteGuards | None, rate: float
) -> dict[str, Any]:
    counts = counts or RouteCounts()
    route: dict[str, Any] = {
        "name": name,
        "calls_per_s": round(rate, 2),
        "calls": counts.calls,
        "ok": counts.ok,
        "recovered": counts.recovered,
        "answered": counts.answered,
        "gave_up": counts.gave_up,
        "circuits": [],
        "cooldowns": [],
        "budget_left": None,
    }
    if guards is None:  # the calls no route matched
        return route
    view = snapshot(guards)
    route["circuits"] = [
        {
            "tool": mask_path(circuit.tool),
            "state": circuit.state,
            "probe_in_s": round(circuit.probe_in_s, 1),
        }
        for circuit in view.circuits
    ]
    route["cooldowns"] = [
        {
            "tool": mask_path(cooldown.tool),
            "path": mask_path(cooldown.path),
            "left_s": round(cooldown.left_s, 1),
        }
        for cooldown in view.cooldowns
    ]
    route["budget_left"] = int(view.budget_left)
    return route


def _call(record: CallRecord) -> dict[str, Any]:
    return {
        "number": record.number,
        "finished_at": record.finished_at,
        "route": record.route,
        "method": record.method,
        "path": mask_path(record.path),
        "outcome": record.outcome,
        "answered": record.answered,
        "status": record.status,
        "attempts": record.attempts,
        "duration_ms": round(record.duration_s * 1000, 1),
        "trail": record.trail.split(", ") if record.trail else [],
        "repairs": [{"layer": layer, "fields": list(fields)} for layer, fields in record.repairs],
    }
