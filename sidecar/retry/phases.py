"""The retry machine's protocol: the phase a request's life is in, and the events each
phase takes.

As h11's connection refuses an event its state does not allow, the machine refuses an
event out of turn: each command it gives puts it in the phase that waits for that
command's answer (``AWAITS``), and in each phase only the events of ``EVENTS`` are legal.
An engine that answers a command it was not given, or twice, is a bug in the sidecar
(``OutOfTurn``), never a fault of the tool's.
"""

from __future__ import annotations

import enum

from sidecar.bugs import SidecarBug
from sidecar.retry.steps import (
    Paused,
    Prepare,
    ReadCooldown,
    Relayed,
    ReopenSession,
    Repair,
    Send,
    SendHedged,
    Settle,
    Unanswered,
    WaitCooldown,
    WaitRetry,
)


class Phase(enum.Enum):
    """What the machine waits for."""

    NEW = "new"  # the request, to start
    READING_COOLDOWN = "reading_cooldown"  # the fleet's cooldown of the tool
    PREPARING = "preparing"  # the payload that goes first
    SENDING = "sending"  # an attempt's answer (or its hedge's timer)
    WAITING = "waiting"  # a retry's wait to end
    COOLING_DOWN = "cooling_down"  # the fleet's cooldown to end
    REPAIRING = "repairing"  # the repair layers' answer
    REOPENING = "reopening"  # the MCP session opened again, or not
    SETTLING = "settling"  # the circuit to count the verdict
    ENDED = "ended"  # nothing: the result is given


class MachineEvent(enum.Enum):
    """What the engine tells the machine: one method of the machine each."""

    START = "start"
    COOLDOWN_READ = "cooldown_read"
    PREPARED = "prepared"
    ANSWERED = "answered"
    HEDGE_DUE = "hedge_due"
    SLEPT = "slept"
    REPAIRED = "repaired"
    REOPENED = "reopened"
    SETTLED = "settled"
    CANCELLED = "cancelled"
    AGENT_GONE = "agent_gone"


_E = MachineEvent
# The agent may cancel or go away whenever the engine waits on something: an attempt, a
# wait, a repair, or a report it carries out before the verdict is counted (a cooldown
# shared with the fleet); and before the engine's task first ran, as a task cancelled
# before its first step never starts the machine.
_AGENT = frozenset({_E.CANCELLED, _E.AGENT_GONE})

EVENTS: dict[Phase, frozenset[MachineEvent]] = {
    Phase.NEW: frozenset({_E.START}) | _AGENT,
    Phase.READING_COOLDOWN: frozenset({_E.COOLDOWN_READ}) | _AGENT,
    Phase.PREPARING: frozenset({_E.PREPARED}) | _AGENT,
    Phase.SENDING: frozenset({_E.ANSWERED, _E.HEDGE_DUE}) | _AGENT,
    Phase.WAITING: frozenset({_E.SLEPT}) | _AGENT,
    Phase.COOLING_DOWN: frozenset({_E.SLEPT}) | _AGENT,
    Phase.REPAIRING: frozenset({_E.REPAIRED}) | _AGENT,
    Phase.REOPENING: frozenset({_E.REOPENED}) | _AGENT,
    Phase.SETTLING: frozenset({_E.SETTLED}) | _AGENT,
    # The result is given; an engine cancelled before it returned it lets the answer go.
    Phase.ENDED: frozenset({_E.AGENT_GONE}),
}

# The phase each command puts the machine in.
AWAITS: dict[type, Phase] = {
    ReadCooldown: Phase.READING_COOLDOWN,
    Prepare: Phase.PREPARING,
    Send: Phase.SENDING,
    SendHedged: Phase.SENDING,
    WaitRetry: Phase.WAITING,
    WaitCooldown: Phase.COOLING_DOWN,
    Repair: Phase.REPAIRING,
    ReopenSession: Phase.REOPENING,
    Settle: Phase.SETTLING,
    Relayed: Phase.ENDED,
    Unanswered: Phase.ENDED,
    Paused: Phase.ENDED,
}


class OutOfTurn(SidecarBug):
    """An event the machine's phase does not take."""

    def __init__(self, event: MachineEvent, phase: Phase) -> None:
        super().__init__(f"{event.value} while {phase.value}")
        self.event = event
        self.phase = phase
