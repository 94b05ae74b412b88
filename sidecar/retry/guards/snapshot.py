"""A route's guards as they stand, read without changing them: for a person to look at.

``snapshot`` is the one place that knows how a route's guards are laid out (one circuit
per route, or one per tool; cooldowns for the route or for a path), so a page that shows
them reads plain values and never the guards themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.retry.guards.circuit import CircuitState
from sidecar.retry.guards.route import RouteGuards

STATE_NAMES = {
    CircuitState.CLOSED: "closed",
    CircuitState.HALF_OPEN: "half-open",
    CircuitState.OPEN: "open",
}


@dataclass(frozen=True, slots=True)
class CircuitView:
    """One circuit: the tool it guards (``""``: every call of the route), its state, and
    the seconds until it lets a probe through (0 unless open)."""

    tool: str
    state: str
    probe_in_s: float


@dataclass(frozen=True, slots=True)
class CooldownView:
    """A cooldown still running: what it holds back (``""``: the whole route, else a
    path) and the seconds it has left."""

    scope: str
    left_s: float


@dataclass(frozen=True, slots=True)
class GuardsView:
    circuits: tuple[CircuitView, ...]
    cooldowns: tuple[CooldownView, ...]
    budget_left: float  # retries the route's budget allows now


def snapshot(guards: RouteGuards) -> GuardsView:
    """What ``guards`` hold now."""
    circuit = guards.circuit
    circuits = (CircuitView("", STATE_NAMES[circuit.state], circuit.open_for_s()),)
    known = guards.fleet.known_cooldowns() if guards.fleet is not None else {}
    cooldowns = tuple(
        CooldownView(scope or "", left_s)
        for scope, left_s in sorted(known.items(), key=lambda item: item[1], reverse=True)
    )
    return GuardsView(circuits, cooldowns, guards.budget.left())
