"""An MCP request the agent cancelled: its retries end at once.

An MCP client that gives up on a request (the OpenAI Agents SDK after its 5 s timeout, a
user's stop) sends ``notifications/cancelled`` with the request's id, on the session the
request went on (its ``Mcp-Session-Id``). The notification is relayed to the tool as any
request is; here, it also stops the request's retry loop where it is: an attempt in
flight is abandoned, a wait is cut, and no attempt follows. The agent's request ends with
the tool's last answer when one exists, else ``504 UPSTREAM_TIMEOUT`` with
``details.reason: "cancelled"``; its outcome is ``deadline`` (the agent's own deadline),
its trail ends in ``stop=cancelled``.

Only requests that carry a session id are tracked: without one, two agents' ids could
be the same and one could cancel the other's call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator, Mapping
from typing import TypeVar

from sidecar.retry.replay import SESSION_HEADER
from sidecar.tool.eventstream import rpc_id_text
from sidecar.tool.json_value import parse_json

CANCELLED = "notifications/cancelled"
# Requests one process tracks at most: ids come from agents.
MAX_TRACKED = 10_000

Ended = TypeVar("Ended")
Key = tuple[str, str, bytes]  # route, session id, the JSON-RPC id as JSON


def _message(
    headers: Mapping[str, str], body: bytes | None
) -> tuple[str, dict[str, object]] | None:
    """The session id and the JSON-RPC message of an MCP POST body, when it is one."""
    session = headers.get(SESSION_HEADER)
    if not session or body is None or b'"jsonrpc"' not in body:
        return None
    document = parse_json(body)
    if not isinstance(document, dict) or not isinstance(document.get("method"), str):
        return None
    return session, document


class InFlight:
    """The MCP requests in flight, by route, session and JSON-RPC id."""

    def __init__(self, max_tracked: int = MAX_TRACKED) -> None:
        self._stops: dict[Key, asyncio.Event] = {}
        self._max_tracked = max_tracked

    @contextlib.contextmanager
    def watch(
        self, route: str, headers: Mapping[str, str], body: bytes | None
    ) -> Iterator[asyncio.Event | None]:
        """For the length of a request's retries: the event its cancellation sets (``None``
        when it cannot be cancelled). A request that is itself a cancellation sets the
        event of the request it names."""
        message = _message(headers, body)
        if message is None:
            yield None
            return
        session, document = message
        if document["method"] == CANCELLED:
            params = document.get("params")
            requested = params.get("requestId") if isinstance(params, dict) else None
            target = rpc_id_text(requested) if requested is not None else None
            stop = self._stops.get((route, session, target)) if target else None
            if stop is not None:
                stop.set()
            yield None
            return
        rpc_id = rpc_id_text(document["id"]) if document.get("id") is not None else None
        if rpc_id is None or len(self._stops) >= self._max_tracked:
            yield None
            return
        key, stop = (route, session, rpc_id), asyncio.Event()
        self._stops[key] = stop
        try:
            yield stop
        finally:
            if self._stops.get(key) is stop:
                del self._stops[key]


async def unless_stopped(work: Awaitable[Ended], stop: asyncio.Event | None) -> Ended | None:
    """``work``'s result, or ``None`` when ``stop`` is set first (``work`` is then
    cancelled, and has ended, when this returns)."""
    if stop is None:
        return await work
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            # Ended before this returns: its attempt's connection is closed, its spans end.
            await asyncio.wait((task,))
    return task.result() if not task.cancelled() else None
