"""A route's guards as they stand, read without changing them: for a person to look at.

``snapshot`` is the one place that knows how a route's guards are laid out (a circuit and
cooldowns per tool, the budget per route), so a page that shows them reads plain values
and never the guards themselves.
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
    """One tool's circuit (``tool`` ``""``: the whole route's, in the ``route`` scope): its
    state, and the seconds until it lets a probe through (0 unless open)."""

    tool: str
    state: str
    probe_in_s: float


@dataclass(frozen=True, slots=True)
class CooldownView:
    """A cooldown still running: the tool it holds back, the path (``""``: every path of
    the tool) and the seconds it has left."""

    tool: str
    path: str
    left_s: float


@dataclass(frozen=True, slots=True)
class GuardsView:
    circuits: tuple[CircuitView, ...]  # open first, then half-open, then closed
    cooldowns: tuple[CooldownView, ...]  # the longest first
    budget_left: float  # retries the route's budget allows now


def snapshot(guards: RouteGuards) -> GuardsView:
    """What ``guards`` hold now. A tool has guards from its first call on."""
    tools = sorted(guards.tools.items(), key=lambda item: (-item[1].circuit.state, item[0]))
    circuits = tuple(
        CircuitView(tool, STATE_NAMES[held.circuit.state], held.circuit.open_for_s())
        for tool, held in tools
    )
    cooldowns = sorted(
        (
            CooldownView(tool, path or "", left_s)
            for tool, held in guards.tools.items()
            if held.fleet is not None
            for path, left_s in held.fleet.known_cooldowns().items()
        ),
        key=lambda view: -view.left_s,
    )
    return GuardsView(circuits, tuple(cooldowns), guards.budget.left())
