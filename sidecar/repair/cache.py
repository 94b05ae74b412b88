"""Where repair answers are kept: a small LRU of this process's whose entries expire, and
the shape of a store shared with other replicas."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

Value = TypeVar("Value")


class TtlLru(Generic[Value]):
    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self._entries: OrderedDict[Hashable, tuple[float, Value]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock

    def get(self, key: Hashable) -> Value | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        stored_at, value = entry
        if self._clock() - stored_at > self._ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Value) -> None:
        self._entries[key] = (self._clock(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


class SharedAnswers(Protocol):
    """A store of repair answers every replica of a route reads and writes (the fleet's)."""

    async def cached(self, key: str) -> bytes | None: ...
    async def cache(self, key: str, value: bytes, ttl_s: float) -> None: ...
