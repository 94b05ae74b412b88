"""Counts over a sliding time window in a fixed number of time slices (fixed memory).

Each slice covers ``window_s / slices`` seconds; a total is the sum of the slices that
are still inside the window, so what it covers is between ``window_s`` less one slice
and ``window_s``. tower's and Linkerd's retry budgets keep their counts the same way.
"""

from __future__ import annotations

from collections.abc import Callable

SLICES = 10


class SlidingCounts:
    """``fields`` counters (indexed from 0) over the last ``window_s`` seconds."""

    def __init__(
        self, window_s: float, clock: Callable[[], float], fields: int, slices: int = SLICES
    ) -> None:
        self._slice_s = window_s / slices
        self._clock = clock
        self._fields = fields
        self._counts = [[0] * fields for _ in range(slices)]
        self._slice_ids = [-1] * slices

    def add(self, field: int, amount: int = 1) -> None:
        slice_id = int(self._clock() // self._slice_s)
        position = slice_id % len(self._counts)
        if self._slice_ids[position] != slice_id:
            self._slice_ids[position] = slice_id
            self._counts[position] = [0] * self._fields
        self._counts[position][field] += amount

    def totals(self) -> list[int]:
        """Each counter's sum over the window."""
        oldest = int(self._clock() // self._slice_s) - len(self._counts)
        sums = [0] * self._fields
        for slice_id, counts in zip(self._slice_ids, self._counts, strict=True):
            if slice_id > oldest:
                for field, count in enumerate(counts):
                    sums[field] += count
        return sums

    def clear(self) -> None:
        self._slice_ids = [-1] * len(self._counts)
