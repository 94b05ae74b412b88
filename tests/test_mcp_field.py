"""MCP's own state and streams through the sidecar, against the MCP SDK's server.

The server is the Python MCP SDK's streamable-HTTP server on uvicorn, as its users run it:
DNS-rebinding protection on (the SDK's default on 127.0.0.1), an event store where a test
needs resumable streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from aiohttp import web
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from structlog.testing import capture_logs

from tests.asgi import uvicorn_serving
from tests.wire import Wire, mcp_client

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "field-test", "version": "1"},
    },
}
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def sidecar_before(
    server: MCPServer, make_sidecar: Callable[..., Any], **settings: Any
) -> AsyncIterator[Any]:
    """The sidecar in front of ``server``'s streamable-HTTP app."""
    async with uvicorn_serving(server.streamable_http_app()) as url:
        yield await make_sidecar(url, **settings)


@pytest.mark.security
@pytest.mark.parametrize(
    ("headers", "refused_with"),
    [
        ({"Host": "evil.example.com"}, 421),
        ({"Origin": "http://evil.example.com"}, 403),
        ({}, None),
    ],
    ids=["rebound-host", "foreign-origin", "local"],
)
async def test_the_servers_dns_rebinding_check_judges_what_the_agent_sent(
    make_sidecar, headers, refused_with
):
    """The SDK's check refuses a rebound name or a foreign page through the sidecar as it
    does directly; with the sidecar's own address as ``Host`` (0.5) both got a session."""
    async with sidecar_before(MCPServer("local"), make_sidecar) as sidecar:
        answer = await sidecar.client.post(
            "/mcp", data=orjson.dumps(INITIALIZE), headers={**MCP_HEADERS, **headers}
        )
        body = await answer.read()

    if refused_with is None:
        assert answer.status == 200
        assert answer.headers["Mcp-Session-Id"]
    else:
        assert answer.status == refused_with
        assert "Mcp-Session-Id" not in answer.headers
        assert b"Invalid" in body
    assert answer.headers["X-Sidecar-Attempts"] == "1"


async def test_a_route_that_rewrites_host_names_the_tool(make_sidecar):
    """``host_rewrite``: the tool gets its own address, which its allow-list accepts."""
    async with sidecar_before(MCPServer("local"), make_sidecar, host_rewrite=True) as sidecar:
        answer = await sidecar.client.post(
            "/mcp",
            data=orjson.dumps(INITIALIZE),
            headers={**MCP_HEADERS, "Host": "agent.example"},
        )

    assert answer.status == 200


async def test_a_call_the_sidecar_gives_up_on_fails_alone_and_the_session_goes_on(make_sidecar):
    """The tool outlives the per-try timeout on a call not safe to send twice: the client gets
    the sidecar's JSON-RPC error for that call (``data`` says why) and its session serves the
    next call."""
    server = MCPServer("slow")

    @server.tool()
    async def transfer(amount: int) -> str:
        await asyncio.sleep(1 if amount > 100 else 0)
        return f"sent {amount}"

    app = server.streamable_http_app(json_response=True)
    async with uvicorn_serving(app) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=300)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            with pytest.raises(MCPError) as gave_up:
                await client.call_tool("transfer", {"amount": 500})
            after = await client.call_tool("transfer", {"amount": 5})

    assert gave_up.value.code == -32000
    assert gave_up.value.data["code"] == "UPSTREAM_TIMEOUT"
    assert gave_up.value.data["delivered"] == "maybe"
    assert after.content[0].text == "sent 5"
    first, second = wire.tool_calls()
    assert (first.status, first.headers["X-Sidecar-Outcome"]) == (200, "not-retryable")
    assert second.headers["X-Sidecar-Outcome"] == "ok"


async def test_a_2025_servers_refusal_of_the_version_probe_is_its_answer_not_a_failure(
    make_tool, make_sidecar
):
    """pydantic-ai and the SDK's ``auto`` mode open with ``server/discover``; a 2025 server
    answers 400 and the client speaks 2025. That is the probe's answer: ``ok``, no line."""

    async def legacy(request: web.Request) -> web.Response:
        refusal = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Bad"}}
        return web.json_response(refusal, status=400)

    sidecar = await make_sidecar(await make_tool(legacy))
    probe = {"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}}

    with capture_logs() as logs:
        answer = await sidecar.client.post("/mcp", json=probe, headers=MCP_HEADERS)
        tools_list = await sidecar.client.post(
            "/mcp", json={**probe, "method": "tools/list"}, headers=MCP_HEADERS
        )

    assert (answer.status, answer.headers["X-Sidecar-Outcome"]) == (400, "ok")
    assert (tools_list.status, tools_list.headers["X-Sidecar-Outcome"]) == (400, "not-retryable")
    assert [line["trail"] for line in logs if line["log_level"] == "info"] == ["400"]
