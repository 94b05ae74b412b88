"""MCP's own state and streams through the sidecar, against the MCP SDK's server.

The server is the Python MCP SDK's streamable-HTTP server on uvicorn, as its users run it:
DNS-rebinding protection on (the SDK's default on 127.0.0.1), an event store where a test
needs resumable streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from mcp.server.mcpserver import MCPServer

from tests.asgi import uvicorn_serving

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
