"""MCP sessions a server forgot, opened again (MCP 2025-11-25 and earlier).

A streamable-HTTP server that restarts, or drops an idle session, answers ``404`` to every
request that names the session's ``Mcp-Session-Id``; the specification asks the client to
start a new session, and no client does it by itself, so every task on the session is lost.
A ``404`` for an unknown session also proves the request never ran. The sidecar relayed the
``initialize`` that opened the session, so it can open a new one the same way: the
agent's ``initialize``, sent again (with the credentials of the request that failed), then
``notifications/initialized``; the failed request goes once more, on the new session. For
the rest of the session the agent's id stands for the new one: requests name the new id,
answers the agent's. What the old session held at the server (subscriptions, a log level,
anything a tool kept) is gone: the new session starts as the agent's first did.

What is kept per route: each session's ``initialize`` body and the id the server now knows
it by, for at most ``MAX_SESSIONS`` sessions and ``MAX_AGE_S`` since each was last named;
with a fleet store, also there (``{prefix}{route}:mcp-session:{digest}``), so that another
replica can open a session again that this one saw opened.

One agent session is opened again once, however many of its requests met the ``404``
together (its ``GET`` stream and a ``POST``, say): the others wait for that one and go on
the session it opened, as does a request sent before it was opened (here or, with a fleet
store, on another replica). Otherwise the agent's stream and its calls would end up on two
sessions, the stream hearing nothing of the calls.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from multidict import CIMultiDict

from sidecar.retry.guards.fleet import RouteState
from sidecar.retry.replay import SESSION_HEADER
from sidecar.transport.exchange import Answer, UpstreamRequest, read_for_decision, send
from sidecar.transport.pool import Pool, Response

MAX_SESSIONS = 10_000
MAX_AGE_S = 24 * 60 * 60
# An ``initialize`` larger than this is not kept (its session cannot be opened again): a
# client's is a few hundred bytes, and ten thousand padded ones must not hold gigabytes.
MAX_INITIALIZE_BYTES = 64 * 1024
# What a request waiting on another's reopening is told when that one was cancelled
# before it knew: open it yourself. (A session id is never empty.)
_TAKE_OVER = ""
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
# What a new session's requests leave out of the failed request's headers: those of its body
# and of the old session.
_NOT_CARRIED = frozenset(
    {"content-length", "content-type", "content-encoding", "last-event-id", "mcp-session-id"}
)


class Reopened(NamedTuple):
    """A failed request's session, opened again: the request naming the new session
    (``None``: it could not be), and whether this request opened it (rather than found it
    opened by another of the session's requests)."""

    request: UpstreamRequest | None
    opened_here: bool


@dataclass(slots=True)
class _Session:
    initialize: bytes  # the agent's initialize request, as it came
    upstream: str  # the id the server knows the session by now
    until: float  # forgotten then, unless named again (clock time)


class McpSessions:
    """One route's MCP sessions, by the id their agent knows them by."""

    def __init__(
        self,
        fleet: RouteState | None,
        clock: Callable[[], float],
        *,
        max_sessions: int = MAX_SESSIONS,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self._fleet = fleet
        self._clock = clock
        self._max_sessions = max_sessions
        self._max_age_s = max_age_s
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        # The reopening under way of each agent session, for its other requests to await.
        self._opening: dict[str, asyncio.Future[str | None]] = {}
        # Sessions their agent ended (DELETE) while they were being opened again.
        self._ended_while_opening: set[str] = set()

    def opening(self, session: str) -> bool:
        """Whether one of ``session``'s requests is opening it again now."""
        return session in self._opening

    def upstream_of(self, session: str) -> str | None:
        """The id the server knows the agent's ``session`` by, when it is another (the
        session was opened again); ``None`` when it is the same or the session unknown."""
        kept = self._named(session)
        if kept is None or kept.upstream == session:
            return None
        return kept.upstream

    async def opened(self, session: str, initialize: bytes) -> None:
        """An ``initialize`` the sidecar relayed opened ``session``."""
        if len(initialize) > MAX_INITIALIZE_BYTES:
            return
        self._keep(session, _Session(initialize, session, 0.0))
        if self._fleet is not None:
            await self._fleet.keep_mcp_session(session, initialize, session, self._max_age_s)

    async def initialize_of(self, session: str) -> bytes | None:
        """The ``initialize`` that opened the agent's ``session``, here or in the fleet."""
        kept = self._named(session)
        if kept is not None:
            return kept.initialize
        if self._fleet is None:
            return None
        shared = await self._fleet.mcp_session(session)
        if shared is None:
            return None
        initialize, upstream = shared
        self._keep(session, _Session(initialize, upstream, 0.0))
        return initialize

    async def reopen(
        self, pool: Pool, failed: UpstreamRequest, session: str, limit: int, timeout_s: float
    ) -> Reopened:
        """The agent's ``session``, which the server ``failed`` went to forgot, opened again
        with the ``initialize`` that first opened it; none when the sidecar never saw it
        opened or the server would not open it."""
        while (opening := self._opening.get(session)) is not None:
            upstream = await asyncio.shield(opening)
            if upstream != _TAKE_OVER:
                return Reopened(_on_new_session(failed, upstream), False)
        # Claimed before anything is awaited: the session's other requests wait for this.
        opening = self._opening[session] = asyncio.get_running_loop().create_future()
        upstream = _TAKE_OVER
        try:
            current = await self._current_upstream(session)
            if current is not None and current != failed.headers.get(SESSION_HEADER):
                upstream = current  # opened again since this request was sent
                return Reopened(_on_new_session(failed, upstream), False)
            upstream = await self._open_again(pool, failed, session, limit, timeout_s)
            return Reopened(_on_new_session(failed, upstream), True)
        finally:
            opening.set_result(upstream)
            del self._opening[session]
            self._ended_while_opening.discard(session)

    async def _open_again(
        self, pool: Pool, failed: UpstreamRequest, session: str, limit: int, timeout_s: float
    ) -> str | None:
        initialize = await self.initialize_of(session)
        if initialize is None:
            return None
        upstream = await _open(pool, failed, initialize, limit, timeout_s)
        if upstream is None or session in self._ended_while_opening:
            return None  # an ended session is not brought back, here or in the fleet
        self._keep(session, _Session(initialize, upstream, 0.0))
        if self._fleet is not None:
            await self._fleet.keep_mcp_session(session, initialize, upstream, self._max_age_s)
        return upstream

    async def _current_upstream(self, session: str) -> str | None:
        """The id the server knows the agent's ``session`` by, as this replica or the fleet
        last opened it (the fleet's is fresher: another replica may have opened it again)."""
        if self._fleet is not None:
            shared = await self._fleet.mcp_session(session)
            if shared is not None:
                initialize, upstream = shared
                self._keep(session, _Session(initialize, upstream, 0.0))
                return upstream
        kept = self._named(session)
        return kept.upstream if kept is not None else None

    async def answered(
        self,
        method: str,
        session: str | None,
        opening: bytes | None,
        status: int,
        answer_session: str | None,
    ) -> str | None:
        """The books after a request on the route was answered: a session opened (an
        ``initialize``, ``opening``, answered with a session id) or ended (``DELETE``). The
        id the agent must see in the answer's ``Mcp-Session-Id``, when the server's differs
        (its session was opened again)."""
        if opening is not None and answer_session is not None and 200 <= status < 300:
            await self.opened(answer_session, opening)
            return None
        if session is None:
            return None
        if method == "DELETE":
            self._sessions.pop(session, None)
            if session in self._opening:
                self._ended_while_opening.add(session)
            if self._fleet is not None:
                await self._fleet.forget_mcp_session(session)
            return None
        if answer_session is not None and self.upstream_of(session) == answer_session:
            return session
        return None

    def _named(self, session: str) -> _Session | None:
        kept = self._sessions.get(session)
        if kept is None:
            return None
        now = self._clock()
        if kept.until <= now:
            del self._sessions[session]
            return None
        kept.until = now + self._max_age_s
        self._sessions.move_to_end(session)
        return kept

    def _keep(self, session: str, kept: _Session) -> None:
        kept.until = self._clock() + self._max_age_s
        self._sessions[session] = kept
        self._sessions.move_to_end(session)
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)


async def _open(
    pool: Pool, failed: UpstreamRequest, initialize: bytes, limit: int, timeout_s: float
) -> str | None:
    """A new session opened with ``initialize`` on the server ``failed`` went to, with its
    credentials; the id the server gave it, or ``None`` when it gave none. A ``404`` to
    its ``notifications/initialized`` says the server forgot it already (it restarted
    again): the id is given all the same, so that the request meets the same ``404`` and
    the machine decides whether to open one once more."""
    headers: CIMultiDict[str] = CIMultiDict(
        (name, value) for name, value in failed.headers.items() if name.lower() not in _NOT_CARRIED
    )
    headers["Content-Type"] = "application/json"
    headers["Accept"] = "application/json, text/event-stream"
    opening = UpstreamRequest("POST", failed.url, headers, initialize, host=failed.host)
    opened = await _exchanged(pool, opening, limit, timeout_s)
    session = None if opened is None else opened.headers.get(SESSION_HEADER)
    if session is None or not _succeeded(opened):
        return None
    headers[SESSION_HEADER] = session
    initialized = UpstreamRequest("POST", failed.url, headers, INITIALIZED, host=failed.host)
    acknowledged = await _exchanged(pool, initialized, limit, timeout_s)
    if acknowledged is None or not (_succeeded(acknowledged) or acknowledged.status == 404):
        return None
    return session


def _succeeded(answered: Response | None) -> bool:
    return answered is not None and 200 <= answered.status < 300


async def _exchanged(
    pool: Pool, request: UpstreamRequest, limit: int, timeout_s: float
) -> Response | None:
    """``request``'s answer, read and given back; ``None`` when none came whole."""
    sent = await send(pool, request, timeout_s)
    if not isinstance(sent, Response):
        return None
    answer = await read_for_decision(request, sent, limit, timeout_s)
    if not isinstance(answer, Answer):
        return None  # broken or malformed: its connection is closed already
    answer.discard()
    return sent


def _on_new_session(failed: UpstreamRequest, upstream: str | None) -> UpstreamRequest | None:
    """``failed`` sent again on the session the server knows as ``upstream`` (``None``:
    none could be opened), without a ``Last-Event-ID``: the new session's events are
    numbered anew."""
    if upstream is None:
        return None
    request = with_session(failed, upstream)
    if "Last-Event-ID" in request.headers:
        headers = request.headers.copy()
        del headers["Last-Event-ID"]
        request = request.with_headers(headers)
    return request


def with_session(request: UpstreamRequest, session: str) -> UpstreamRequest:
    """``request`` naming ``session``."""
    headers = request.headers.copy()
    headers[SESSION_HEADER] = session
    return request.with_headers(headers)
