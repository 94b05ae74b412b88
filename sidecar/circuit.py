"""The per-route circuit breaker: closed, open after N consecutive failures, half-open probe.

A failure is an attempt that ended in a connect error, a timeout, or a status in
``RETRY_ON_STATUS`` — counted whether or not a retry follows. While open, calls are
answered ``CIRCUIT_OPEN`` at once; after ``open_s`` one probe is let through, and its
result closes the circuit again or re-opens it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class CircuitState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(self, failures: int, open_s: float, clock: Callable[[], float]) -> None:
        self._threshold = failures  # 0 disables the breaker
        self._open_s = open_s
        self._clock = clock
        self._consecutive = 0
        self._opened_at = 0.0
        self._probing = False
        self.state = CircuitState.CLOSED

    def admit(self) -> float | None:
        """``None`` if an attempt may go now, else the seconds until the next probe."""
        if self.state is CircuitState.CLOSED:
            return None
        remaining = self._opened_at + self._open_s - self._clock()
        if self.state is CircuitState.OPEN and remaining <= 0:
            self.state = CircuitState.HALF_OPEN
        if self.state is CircuitState.HALF_OPEN and not self._probing:
            self._probing = True
            return None
        return max(remaining, 0.0)

    def record(self, failed: bool) -> None:
        """The result of an attempt that ``admit`` let through."""
        self._probing = False
        if not failed:
            self._consecutive = 0
            self.state = CircuitState.CLOSED
            return
        self._consecutive += 1
        if self.state is CircuitState.HALF_OPEN or (
            self._threshold and self._consecutive >= self._threshold
        ):
            self.state = CircuitState.OPEN
            self._opened_at = self._clock()

    def abandon(self) -> None:
        """An admitted attempt never happened (its request was cancelled)."""
        self._probing = False
