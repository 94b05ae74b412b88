"""What a call is, as the loop needs to know before its first attempt: the tool it is for,
whether running it twice is harmless, and whether the sidecar adds its own key; and the
request each attempt sends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sidecar.config import RouteConfig
from sidecar.ids import idempotency_key
from sidecar.repair.payload import Payload
from sidecar.retry.controls import RequestControls
from sidecar.retry.guards.route import RouteGuards
from sidecar.retry.guards.tools import ToolGuards, tool_of
from sidecar.retry.policy import Limits
from sidecar.retry.replay import (
    SESSION_HEADER,
    VERSION_PROBES,
    Rpc,
    mcp_call,
    mcp_safe,
    safe_to_repeat,
)
from sidecar.retry.sessions import with_session
from sidecar.retry.steps import Terms
from sidecar.transport.exchange import UpstreamRequest

# The OpenAPI path template a ``method path`` matched on a route, when its schema has one.
PathTemplate = Callable[[str, str, str], str | None]


# Not frozen: made on every request, and a frozen dataclass's __init__ costs a setattr
# call per field.
@dataclass(slots=True)
class Call:
    """What a call is, read once before its first attempt."""

    request: UpstreamRequest  # with the JSON-RPC id its answer carries, when it is a request
    path: str  # without the query
    rpc: Rpc | None  # its JSON-RPC method, tool and id, when it is one
    own_key: str  # the sidecar's idempotency header; "" when off or the agent sent a key
    # Safe to run twice by what the call is; ``replay_delivered: always`` replays the
    # others too, but never hedges them.
    safe_to_repeat: bool
    tool: str  # whose circuit and cooldowns it goes by ("": the whole route's)
    lists_tools: bool  # an MCP ``tools/list``: its result says which tools are safe to repeat
    probe: bool  # a protocol version probe: a 4xx is its answer, not the tool's failure
    session: str | None  # the MCP session the agent named (``Mcp-Session-Id``)
    reopenable: bool  # ... which the sidecar may open again if its server forgot it


def describe(
    route: RouteConfig,
    request: UpstreamRequest,
    payload: Payload | None,
    guards: RouteGuards,
    path_template: PathTemplate,
) -> Call:
    """``request`` (its buffered ``payload``, when there is one) as the loop sees it."""
    path = request.url.path
    header = route.tuning.idempotency_header
    rpc = mcp_call(payload.body) if payload is not None else None
    safe = safe_to_repeat(
        request.method,
        request.headers,
        key_header=header,
        route_idempotent=route.idempotent,
        mcp_safe=mcp_safe(rpc, guards.mcp_tools),
    )
    scope = route.tuning.circuit_scope
    template = (
        path_template(route.name, request.method, path) if scope == "tool" and rpc is None else None
    )
    own_key = "" if header in request.headers else header
    if rpc is not None and rpc.id is not None:
        request = replace(request, rpc_id=rpc.id)
    tool = tool_of(scope, path, template, rpc)
    lists = rpc is not None and rpc[0] == "tools/list"
    probe = rpc is not None and rpc[0] in VERSION_PROBES
    session = request.headers.get(SESSION_HEADER)
    reopenable = False
    if session is not None:
        # A session the sidecar opened again goes by the server's new id.
        upstream = guards.sessions.upstream_of(session)
        if upstream is not None:
            request = with_session(request, upstream)
        reopenable = request.method != "DELETE" and (rpc is None or rpc[0] != "initialize")
    return Call(request, path, rpc, own_key, safe, tool, lists, probe, session, reopenable)


def terms_of(
    route: RouteConfig, controls: RequestControls, call: Call, guards: RouteGuards, now: float
) -> tuple[Terms, ToolGuards]:
    """What the call's retries are bound by (the route's settings, lowered by the agent's),
    and the guards of its tool."""
    tuning = route.tuning
    tool, tool_guards = guards.tool(call.tool)
    terms = Terms(
        limits=Limits(controls.max_retries, tuning.max_retry_after_ms / 1000),
        backoff=guards.backoff,
        deadline=now + controls.timeout_s,
        retry_until=now + controls.retry_window_s,
        per_try_s=tuning.per_try_timeout_ms / 1000,
        safe_to_repeat=call.safe_to_repeat,
        replay_always=tuning.replay_delivered == "always",
        hedge_after_s=tuning.hedge_after_ms / 1000,
        llm_max_repairs=tuning.llm_max_repairs,
        tool=tool,
        path=call.path,
        shares_cooldowns=tool_guards.fleet is not None,
        retry_on_status=tuning.retry_on_status,
        probe=call.probe,
        session_reopenable=call.reopenable,
    )
    return terms, tool_guards


def carrying(request: UpstreamRequest, payload: Payload | None, key_header: str) -> UpstreamRequest:
    """``request`` carrying ``payload`` (``None``: its body streams through as it is), under a
    fresh idempotency key when it is the sidecar's, and with the agent's ``Content-Length``
    restated when the payload's length differs.

    The sidecar's key names one payload: every retry of it carries the same key, and a
    repaired payload (a different request to the tool) gets a new one. A key the agent
    chose is the agent's to keep.
    """
    headers = request.headers
    length = str(len(payload.body)) if payload is not None else None
    restate_length = length is not None and headers.get("Content-Length", length) != length
    if key_header or restate_length:
        headers = headers.copy()
    if key_header:
        headers[key_header] = idempotency_key()
    if restate_length:
        headers["Content-Length"] = str(length)
    if payload is None:
        return replace(request, headers=headers) if key_header else request
    return replace(request, headers=headers, body=payload.body)
