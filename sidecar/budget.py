"""The per-route retry budget: retries may add only a fraction of recent traffic.

Linkerd's rule: over a sliding window, retries are allowed while
``retries < ratio * requests + min_per_s * window``. The floor keeps a quiet route
retryable; the ratio keeps a failing busy route from multiplying its own load.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

WINDOW_S = 10.0


class RetryBudget:
    def __init__(
        self, ratio: float, min_per_s: float, clock: Callable[[], float], window_s: float = WINDOW_S
    ) -> None:
        self._ratio = ratio
        self._floor = min_per_s * window_s
        self._clock = clock
        self._window_s = window_s
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()

    def record_request(self) -> None:
        """A new request (not a retry) arrived."""
        now = self._clock()
        self._forget_before(now - self._window_s)
        self._requests.append(now)

    def try_spend(self) -> bool:
        """Take one retry from the budget, if there is one left."""
        now = self._clock()
        self._forget_before(now - self._window_s)
        if len(self._retries) >= self._ratio * len(self._requests) + self._floor:
            return False
        self._retries.append(now)
        return True

    def _forget_before(self, horizon: float) -> None:
        for times in (self._requests, self._retries):
            while times and times[0] < horizon:
                times.popleft()
