"""When a request that may already have reached the tool may be sent to it again.

A request that never left (connect refused, DNS, a pool wait) can always be sent again.
One that was delivered but got no answer head — the connection reset, the per-try timeout
passed — may be running at the tool right now; sending it again can run the tool's work
twice. Under ``SIDECAR_REPLAY_DELIVERED=safe`` such a request is replayed only when it is
safe to repeat:

- its method is idempotent (RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE);
- the agent sent an ``Idempotency-Key``, so the tool can tell a repeat from a new call;
- its route is configured ``idempotent: true``;
- it is an MCP ``tools/call`` of a tool that the tool server itself annotated
  ``readOnlyHint`` or ``idempotentHint`` in a ``tools/list`` result this sidecar relayed;
- it is one of MCP's own requests that read or set state to a given value (``tools/list``,
  ``resources/read``, ``ping``, ``initialize`` …, ``MCP_SAFE_METHODS``): a session's
  set-up is most of its requests, and a reset there failed the agent's task as surely as
  one in a tool's call.

``SIDECAR_REPLAY_DELIVERED=always`` replays every delivered request (the 0.1 behaviour).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from sidecar.tool.eventstream import rpc_id_text
from sidecar.tool.json_value import parse_json

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
AGENT_KEY_HEADER = "Idempotency-Key"

# The header a 2025 MCP session's requests name it by.
SESSION_HEADER = "Mcp-Session-Id"
# Requests a client sends to learn which protocol revision the server speaks: MCP
# 2026-07-28's ``server/discover``, which a 2025 server refuses with a 4xx that the client
# reads as "speak 2025" (pydantic-ai and the Python SDK's ``auto`` mode do). Such a refusal
# answers the probe; it is no verdict on the tool.
VERSION_PROBES = frozenset({"server/discover"})
# Requests whose answer is a stream that outlives them, as a 2025 session's ``GET`` does:
# MCP 2026-07-28's ``subscriptions/listen`` stays open to carry change notifications.
LONG_LIVED_METHODS = frozenset({"subscriptions/listen"})
# MCP's own requests (2025-11-25) whose second run leaves what the first left: reads, a
# level set again, a notification heard twice. A repeated ``initialize`` opens a second
# session and the agent goes on with the one it is answered; the first ends at the
# server's idle timeout, as any abandoned session does. ``tools/call`` goes by its tool's
# annotations; a method not listed here is not known to be safe, and is not replayed.
MCP_SAFE_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/roots/list_changed",
    }
)

# A tool server can list any number of tools; a route remembers at most this many.
MAX_REMEMBERED_TOOLS = 4096


def safe_to_repeat(
    method: str,
    headers: Mapping[str, str],
    *,
    key_header: str,
    route_idempotent: bool,
    mcp_safe: bool,
) -> bool:
    """Whether running this request twice has the effect of running it once.

    ``headers`` are the agent's own; ``key_header`` is the configured idempotency header
    ("" when off), honoured beside the standard ``Idempotency-Key``.
    """
    return (
        method in IDEMPOTENT_METHODS
        or AGENT_KEY_HEADER in headers
        or (bool(key_header) and key_header in headers)
        or route_idempotent
        or mcp_safe
    )


class Rpc(NamedTuple):
    """A JSON-RPC request body as the loop needs it."""

    method: str
    tool: str | None  # the tool a ``tools/call`` calls
    id: bytes | None  # its id as JSON text; ``None`` for a notification


def mcp_call(body: bytes) -> Rpc | None:
    """The JSON-RPC method of a request body, the tool it calls for ``tools/call``, its id."""
    if b'"jsonrpc"' not in body:
        return None
    document = parse_json(body)
    if not isinstance(document, dict) or not isinstance(document.get("method"), str):
        return None
    params = document.get("params")
    tool = params.get("name") if isinstance(params, dict) else None
    rpc_id = rpc_id_text(document["id"]) if "id" in document else None
    return Rpc(document["method"], tool if isinstance(tool, str) else None, rpc_id)


def mcp_safe(rpc: Rpc | None, hints: McpToolHints) -> bool:
    """Whether an MCP request is safe to run twice by what MCP says of it: one of its own
    safe methods, or a ``tools/call`` of a tool its server annotated so."""
    if rpc is None:
        return False
    if rpc.method == "tools/call":
        return hints.is_safe(rpc.tool)
    return rpc.method in MCP_SAFE_METHODS


class McpToolHints:
    """What one route's MCP server said about its tools: which are safe to call twice."""

    def __init__(self, max_tools: int = MAX_REMEMBERED_TOOLS) -> None:
        self._safe: set[str] = set()
        self._max_tools = max_tools

    def is_safe(self, tool: str | None) -> bool:
        return tool is not None and tool in self._safe

    def learn(self, document: Any) -> None:
        """Read a ``tools/list`` JSON-RPC result; later lists overrule earlier ones."""
        result = document.get("result") if isinstance(document, dict) else None
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            annotations = tool.get("annotations")
            hinted = isinstance(annotations, dict) and (
                annotations.get("readOnlyHint") is True or annotations.get("idempotentHint") is True
            )
            if not hinted:
                self._safe.discard(tool["name"])
            elif len(self._safe) < self._max_tools:
                self._safe.add(tool["name"])
