"""One memory budget for what the sidecar holds of its peers' bytes
(``SIDECAR_MAX_BUFFERED_BYTES``): agents' heads still arriving, request bodies held for
replay, tools' answers held for inspection.

Without it, memory grew about 1:1 with what peers sent: 1,000 unfinished 120 KB heads took
the process from 56 to 180 MiB, 100 concurrent 5 MiB bodies to 558 MiB. Past the budget,
new buffering is refused (the agent gets ``503 SIDECAR_OVERLOADED`` with ``Retry-After``;
a tool's answer goes to the agent uninspected) rather than grown.

A request's holdings are charged to its ``Ledger``, found through a context variable, so
the transport charges an answer without knowing the request, and the proxy gives the
whole back in one ``finally`` however the request ends.
"""

from __future__ import annotations

from contextvars import ContextVar, Token


class BufferBudget:
    """Bytes held for inspection or replay, process-wide; ``limit`` 0: unbounded."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes held; ``False`` (and nothing counted) past the limit."""
        if self.limit and self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


class Ledger:
    """What one request holds of the budget; ``with Ledger(budget):`` around the request
    makes it the one ``hold`` charges, and gives it all back at the end."""

    __slots__ = ("_budget", "_token", "held")

    def __init__(self, budget: BufferBudget) -> None:
        self._budget = budget
        self._token: Token[Ledger | None] | None = None
        self.held = 0

    def __enter__(self) -> Ledger:
        self._token = _current.set(self)
        return self

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
        self.close()

    def take(self, size: int) -> bool:
        if not self._budget.take(size):
            return False
        self.held += size
        return True

    def close(self) -> None:
        self._budget.give(self.held)
        self.held = 0


_current: ContextVar[Ledger | None] = ContextVar("buffer_ledger", default=None)


def hold(size: int) -> bool:
    """Charge ``size`` bytes to the current request; ``False`` past the budget. Outside a
    request (a test driving the transport alone) there is nothing to charge."""
    ledger = _current.get()
    return ledger is None or ledger.take(size)
