"""The per-route retry budget: retries may add only a fraction of recent traffic.

Linkerd's rule: over a sliding window, retries are allowed while
``retries < ratio * requests + min_per_s * window``. The floor keeps a quiet route
retryable; the ratio keeps a failing busy route from multiplying its own load. The
counts live in time slices, so a busy route costs no more memory than a quiet one.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.retry.guards.window import SlidingCounts

WINDOW_S = 10.0
_REQUESTS, _RETRIES = 0, 1


class RetryBudget:
    def __init__(
        self, ratio: float, min_per_s: float, clock: Callable[[], float], window_s: float = WINDOW_S
    ) -> None:
        self._ratio = ratio
        self._floor = min_per_s * window_s
        self._counts = SlidingCounts(window_s, clock, fields=2)

    def record_request(self) -> None:
        """A new request (not a retry) arrived."""
        self._counts.add(_REQUESTS)

    def available(self) -> bool:
        """Whether one more retry fits in the budget now."""
        return self.left() > 0

    def left(self) -> float:
        """How many more retries fit in the budget now (0 when it is spent)."""
        requests, retries = self._counts.totals()
        return max(0.0, self._ratio * requests + self._floor - retries)

    def spend(self) -> None:
        """A retry was made: it counts against the budget."""
        self._counts.add(_RETRIES)
