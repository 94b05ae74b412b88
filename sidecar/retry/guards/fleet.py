"""Fleet state: what one sidecar learns about a tool, every replica reads (Redis or Valkey).

Unset ``SIDECAR_STATE_URL`` keeps every guard in the process, as a single sidecar needs.
Set, each route that has not opted out (``shared_state: false``) shares four things:

* cooldowns — a wait the tool asked for, or an open circuit's remaining time, as a key
  whose time to live is the wait: ``{prefix}{route}:{tool}cooldown`` for the whole tool,
  ``{prefix}{route}:{tool}cooldown:{path digest}`` for one path;
* the circuit's failure-rate window — per-second counters ``{prefix}{route}:{tool}window:r:{s}``
  (requests) and ``...:f:{s}`` (failures) that expire with the window;
* repair answers — ``{prefix}{route}:repair:{digest}``, redacted, with the local cache's TTL;
* the MCP sessions it relayed the opening of — ``{prefix}{route}:mcp-session:{digest}``, the
  agent's ``initialize`` and the id the server knows the session by, for a day
  (``retry.sessions``).

``{tool}`` is ``tool:{tool digest}:`` with the ``tool`` circuit scope, and empty with the
``route`` scope, where the route is one tool.

The route's name is the Redis Cluster hash tag (``{route}``), so every key one request
touches lives in one slot and each exchange is one pipelined round trip.

The store may never be a new way to fail: every call is bounded by ``SIDECAR_STATE_TIMEOUT_MS``
and any failure (slow, down, auth refused) answers "nothing known" beyond the cooldowns
the process has learned itself and not yet seen end, counts
``sidecar_state_errors_total{op}`` and is logged at most once per interval. After a failure
the store is left alone for ``RETRY_PAUSE_S`` so that a dead store costs one timeout per
pause, not one per request; redis-py's pool reconnects on the next call after that.
``redis`` is imported only here and only when a URL is set: it is memory a single sidecar
does not need.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from sidecar.config.served import RouteConfig, ServedSettings
from sidecar.telemetry import Hooks

if TYPE_CHECKING:
    from redis.asyncio import Redis

Result = TypeVar("Result")

# How long the store is left alone after a call failed.
RETRY_PAUSE_S = 0.25

# Paths whose cooldown one process keeps in mind at most: paths come from agents.
MAX_KNOWN_PATHS = 1024

# valkey:// speaks the Redis protocol; redis-py knows it by the Redis names.
_SCHEMES = {"valkey": "redis", "valkeys": "rediss"}


def _digest(text: str) -> str:
    # Paths and cache keys come from agents: a digest keeps each key short and bounded.
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class StateStore:
    """The process's one client of the fleet store, shared by every route."""

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str,
        timeout_s: float,
        hooks: Hooks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._hooks = hooks
        self._clock = clock
        self._paused_until = 0.0

    @classmethod
    def from_settings(
        cls, settings: ServedSettings, hooks: Hooks, clock: Callable[[], float] = time.monotonic
    ) -> StateStore | None:
        """The store ``SIDECAR_STATE_URL`` names, or ``None`` when it is unset."""
        if settings.state_url is None:
            return None
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        url = settings.state_url.get_secret_value()
        scheme, _, rest = url.partition("://")
        timeout_s = settings.state_timeout_ms / 1000
        client = Redis.from_url(
            f"{_SCHEMES.get(scheme, scheme)}://{rest}",
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # One try per call: the sidecar's own pause decides when the store is tried again.
            retry=Retry(NoBackoff(), 0),
        )
        return cls(
            client, prefix=settings.state_prefix, timeout_s=timeout_s, hooks=hooks, clock=clock
        )

    def for_route(self, route: RouteConfig) -> RouteState | None:
        """The route's view of the store, or ``None`` when the route keeps its state local."""
        if not route.shared_state:
            return None
        return RouteState(self, f"{self._prefix}{{{route.name}}}:", self._clock)

    def for_tool(self, route: RouteConfig, tool: str) -> RouteState:
        """One tool's view of the store: its cooldowns and circuit window, beside its
        route's keys (in the same hash slot); the route's own keys for ``""``."""
        tool_part = f"tool:{_digest(tool)}:" if tool else ""
        return RouteState(self, f"{self._prefix}{{{route.name}}}:{tool_part}", self._clock)

    def by_route(self, routes: Iterable[RouteConfig]) -> dict[str, RouteState]:
        """The view of each route that shares its state, by route name."""
        views = {route.name: self.for_route(route) for route in routes}
        return {name: view for name, view in views.items() if view is not None}

    async def call(self, op: str, work: Callable[[Redis], Awaitable[Result]]) -> Result | None:
        """``work`` against the store within the timeout; ``None`` when it failed or the
        store is paused after a failure."""
        if self._clock() < self._paused_until:
            return None
        try:
            async with asyncio.timeout(self._timeout_s):
                return await work(self._client)
        except Exception as exc:  # every store failure means "nothing known", never a fault
            self._paused_until = self._clock() + RETRY_PAUSE_S
            self._hooks.state_error(op, exc)
            return None

    async def close(self) -> None:
        await self._client.aclose()


class RouteState:
    """One route's keys in the fleet store, and the cooldowns this process knows of.

    A cooldown this process published or read is kept in mind until it ends: while it
    lasts no store read is needed, and a store that is slow or gone at that moment (a
    rate-limited fleet is a busy one) does not make the process forget it.
    """

    def __init__(self, store: StateStore, key_prefix: str, clock: Callable[[], float]) -> None:
        self._store = store
        self._key = key_prefix
        self._clock = clock
        # When each known cooldown ends, on ``clock``, by path; ``None`` is the whole route.
        self._known_until: dict[str | None, float] = {}

    def _cooldown_keys(self, path: str | None) -> list[str]:
        route_key = self._key + "cooldown"
        return [route_key] if path is None else [route_key, f"{route_key}:{_digest(path)}"]

    async def cooldown_s(self, path: str) -> float:
        """Seconds until the tool takes calls to ``path`` again, as the fleet knows it."""
        if (known_s := self._known_s(path)) > 0:
            return known_s

        async def read(client: Redis) -> list[int]:
            pipe = client.pipeline(transaction=False)
            for key in self._cooldown_keys(path):
                pipe.pttl(key)
            return await pipe.execute()

        remaining_ms = await self._store.call("cooldown_read", read)
        if not remaining_ms:
            return 0.0
        # A key without a time to live (-1) or gone (-2) holds nothing back.
        for scope, milliseconds in zip((None, path), remaining_ms, strict=False):
            if milliseconds > 0:
                self._remember(milliseconds / 1000, scope)
        return max(0, *remaining_ms) / 1000

    async def publish_cooldown(self, seconds: float, path: str | None = None) -> None:
        """Tell the fleet the tool takes no calls to the route (or ``path``) for ``seconds``.

        The newest word wins: it is the tool's latest statement of when it will be ready.
        This process knows it before the store does, so its own next call holds back even
        while the write is on its way.
        """
        milliseconds = math.ceil(seconds * 1000)
        if milliseconds <= 0:
            return
        self._remember(seconds, path)
        key = self._cooldown_keys(path)[-1]
        await self._store.call("cooldown_write", lambda client: client.set(key, 1, px=milliseconds))

    async def publish_open(self, seconds: float, window_s: float) -> None:
        """A circuit opened: the route cools down for ``seconds`` and the fleet's window
        starts again, as a closing circuit's own window does."""
        milliseconds = math.ceil(seconds * 1000)
        if milliseconds > 0:
            self._remember(seconds, None)

        async def open_circuit(client: Redis) -> Any:
            pipe = client.pipeline(transaction=False)
            if milliseconds > 0:
                pipe.set(self._key + "cooldown", 1, px=milliseconds)
            pipe.delete(*self._window_keys(window_s))
            return await pipe.execute()

        await self._store.call("cooldown_write", open_circuit)

    def known_cooldowns(self) -> dict[str | None, float]:
        """The seconds left of each cooldown this process knows of and has not seen end, by
        path (``None``: every path)."""
        now = self._clock()
        return {scope: until - now for scope, until in self._known_until.items() if until > now}

    def _known_s(self, path: str) -> float:
        now = self._clock()
        ends = (self._known_until.get(scope, now) for scope in (None, path))
        return max(0.0, max(ends) - now)

    def _remember(self, seconds: float, scope: str | None) -> None:
        now = self._clock()
        known = self._known_until
        known[scope] = now + seconds
        if len(known) > MAX_KNOWN_PATHS:
            for ended in [key for key, until in known.items() if until <= now]:
                del known[ended]
            while len(known) > MAX_KNOWN_PATHS:
                del known[min(known, key=known.__getitem__)]

    def _window_keys(self, window_s: float, now: int | None = None) -> list[str]:
        now = int(time.time()) if now is None else now
        seconds = range(now - _window_seconds(window_s) + 1, now + 1)
        return [f"{self._key}window:{kind}:{second}" for second in seconds for kind in "rf"]

    async def count(self, failed: bool, window_s: float) -> tuple[int, int] | None:
        """Add one request's verdict to the fleet's window; its requests and failures over
        the window, or ``None`` when the store could not say."""
        now = int(time.time())
        ttl = _window_seconds(window_s) + 1
        keys = self._window_keys(window_s, now)

        async def add_and_sum(client: Redis) -> tuple[int, int]:
            pipe = client.pipeline(transaction=False)
            for kind in "rf" if failed else "r":
                key = f"{self._key}window:{kind}:{now}"
                pipe.incr(key)
                pipe.expire(key, ttl)
            pipe.mget(keys)
            counts = (await pipe.execute())[-1]
            requests = sum(int(c) for c in counts[0::2] if c is not None)
            failures = sum(int(c) for c in counts[1::2] if c is not None)
            return requests, failures

        return await self._store.call("window", add_and_sum)

    async def cached(self, key: str) -> bytes | None:
        """A repair answer some replica stored under ``key``."""

        async def read(client: Redis) -> bytes | None:
            value = await client.get(self._cache_key(key))
            return value.encode() if isinstance(value, str) else value

        return await self._store.call("cache_read", read)

    async def cache(self, key: str, value: bytes, ttl_s: float) -> None:
        seconds = max(1, math.ceil(ttl_s))
        await self._store.call(
            "cache_write", lambda client: client.set(self._cache_key(key), value, ex=seconds)
        )

    def _cache_key(self, key: str) -> str:
        return f"{self._key}repair:{_digest(key)}"

    async def mcp_session(self, session: str) -> tuple[bytes, str] | None:
        """The ``initialize`` that opened an MCP session some replica relayed, and the id
        the server knows it by now (``retry.sessions``)."""

        async def read(client: Redis) -> list[Any]:
            return await client.hmget(self._session_key(session), ["initialize", "upstream"])

        found = await self._store.call("session_read", read)
        if not found or found[0] is None or found[1] is None:
            return None
        initialize, upstream = found
        return _bytes(initialize), _bytes(upstream).decode()

    async def keep_mcp_session(
        self, session: str, initialize: bytes, upstream: str, ttl_s: float
    ) -> None:
        key, seconds = self._session_key(session), max(1, math.ceil(ttl_s))

        async def write(client: Redis) -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.hset(key, mapping={"initialize": initialize, "upstream": upstream})
            pipe.expire(key, seconds)
            return await pipe.execute()

        await self._store.call("session_write", write)

    async def forget_mcp_session(self, session: str) -> None:
        """The agent ended the session (``DELETE``): no replica opens it again."""
        key = self._session_key(session)
        await self._store.call("session_delete", lambda client: client.delete(key))

    def _session_key(self, session: str) -> str:
        return f"{self._key}mcp-session:{_digest(session)}"


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _window_seconds(window_s: float) -> int:
    return max(1, math.ceil(window_s))
