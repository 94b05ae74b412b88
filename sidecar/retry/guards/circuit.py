"""The per-route circuit breaker: it judges the tool by whole requests, not the traffic shape.

Closed: every request is admitted, and its final verdict — did the tool look unhealthy
when the sidecar stopped (no answer, or a server error that did not forbid retries)? —
is counted in a sliding window. The circuit opens when the window holds at least
``min_calls`` requests, at least ``min_failures`` of them failed, *and* they are at least
``failure_rate`` of all (Hystrix's ``requestVolumeThreshold`` and Resilience4j's
``minimumNumberOfCalls`` with its ``failureRateThreshold``). A rate over a few calls is
noise: one agent's burst of five failed calls in its first six is no evidence that the
next thirty will fail. Counting requests rather than attempts means calls that each
recover after a few failed attempts never open it: a recovered request is a success.

Open: requests are refused (``CIRCUIT_OPEN``) for ``open_s``. Half-open: up to ``probes``
requests go through as probes; one failed probe re-opens the circuit, ``probes``
succeeded probes close it with a fresh window.

Every change of state starts a new generation. A request's verdict counts only in the
generation that admitted it: a slow request from before the circuit opened cannot close
it, and one from before it closed cannot re-open it.

The window also says whether the tool answers (``answering``): a request's retries past
the first three are spent only on a tool that does (``retry.policy``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.retry.guards.window import SlidingCounts

_REQUESTS, _FAILURES = 0, 1
# The requests a window must hold before it says a tool answers.
EVIDENCE = 5


def opens(requests: int, failures: int, min_calls: int, min_failures: int, rate: float) -> bool:
    """Whether a window of ``requests`` finished requests, ``failures`` of them failed, is
    evidence enough to open the circuit."""
    return requests >= min_calls and failures >= min_failures and failures >= rate * requests


class CircuitState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(frozen=True, slots=True)
class Ticket:
    """A request's admission: the generation it belongs to, and whether it is a probe."""

    generation: int
    probe: bool = False


class CircuitBreaker:
    def __init__(
        self,
        *,
        min_failures: int,
        min_calls: int,
        failure_rate: float,
        window_s: float,
        open_s: float,
        probes: int,
        clock: Callable[[], float],
    ) -> None:
        self._min_failures = min_failures  # 0 disables the breaker
        self._min_calls = min_calls  # the evidence a failure rate needs
        self._failure_rate = failure_rate
        self._open_s = open_s
        self._probes = probes
        self._clock = clock
        self._window = SlidingCounts(window_s, clock, fields=2)
        self._generation = 0
        self._opened_at = 0.0
        self._probes_out = 0
        self._probes_passed = 0
        self.state = CircuitState.CLOSED

    def admit(self) -> Ticket | float:
        """A ticket if the request may go to the tool, else the seconds until a probe."""
        if self.state is CircuitState.OPEN:
            remaining = self.open_for_s()
            if remaining > 0:
                return remaining
            self._change(CircuitState.HALF_OPEN)
        if self.state is CircuitState.HALF_OPEN:
            if self._probes_out + self._probes_passed >= self._probes:
                return 0.0  # the probes are out; the answer is a moment away
            self._probes_out += 1
            return Ticket(self._generation, probe=True)
        return Ticket(self._generation)

    def open_for_s(self) -> float:
        """Seconds until the circuit lets a probe through (0 when it is not open)."""
        if self.state is not CircuitState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self._open_s - self._clock())

    def answering(self) -> bool:
        """Whether the tool's recent requests show it up: at least ``EVIDENCE`` of them
        finished in the window, and fewer than the failure rate failed. The window is kept
        also when the breaker is off (``min_failures`` 0): it never opens then."""
        requests, failures = self._window.totals()
        return requests >= EVIDENCE and failures < self._failure_rate * requests

    def allows_more(self, ticket: Ticket) -> bool:
        """Whether a request admitted with ``ticket`` may make another attempt now."""
        return self.state is CircuitState.CLOSED or self._is_current_probe(ticket)

    def counts(self, ticket: Ticket) -> bool:
        """Whether the verdict of a request admitted with ``ticket`` goes into the window."""
        return (
            bool(self._min_failures)
            and self.state is CircuitState.CLOSED
            and ticket.generation == self._generation
        )

    def record(
        self, ticket: Ticket, failed: bool, fleet_totals: tuple[int, int] | None = None
    ) -> None:
        """The final verdict of a request that ``admit`` let through.

        ``fleet_totals`` are the requests and failures the whole fleet counted in the
        window, this verdict included; without them the process's own window decides.
        """
        if ticket.generation != self._generation:
            return
        if self.state is CircuitState.HALF_OPEN:
            if not ticket.probe:
                return
            self._probes_out -= 1
            if failed:
                self._change(CircuitState.OPEN)
            else:
                self._probes_passed += 1
                if self._probes_passed >= self._probes:
                    self._change(CircuitState.CLOSED)
            return
        if self.state is not CircuitState.CLOSED:
            return
        self._window.add(_REQUESTS)
        if not failed:
            return
        self._window.add(_FAILURES)
        if not self._min_failures:
            return  # the breaker is off: the window still says whether the tool answers
        requests, failures = fleet_totals or self._window.totals()
        if opens(requests, failures, self._min_calls, self._min_failures, self._failure_rate):
            self._change(CircuitState.OPEN)

    def abandon(self, ticket: Ticket) -> None:
        """An admitted request ended without a verdict (its agent went away)."""
        if self._is_current_probe(ticket):
            self._probes_out -= 1

    def _is_current_probe(self, ticket: Ticket) -> bool:
        return (
            ticket.probe
            and ticket.generation == self._generation
            and self.state is CircuitState.HALF_OPEN
        )

    def _change(self, state: CircuitState) -> None:
        self.state = state
        self._generation += 1
        self._probes_out = self._probes_passed = 0
        if state is CircuitState.OPEN:
            self._opened_at = self._clock()
        elif state is CircuitState.CLOSED:
            self._window.clear()
