"""What an httpx2-based agent (the MCP SDK's client, the ``openai`` client) got from the sidecar.

Both SDKs turn an error answer into an exception that drops the sidecar's headers and body;
a response hook on their HTTP client keeps them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

# The MCP SDK's own defaults: a response stream may stay open for minutes.
AGENT_TIMEOUT = httpx2.Timeout(30, read=300)


@dataclass
class Exchange:
    """One POST answer as the agent received it."""

    rpc_method: str | None  # the JSON-RPC method the POST carried, if it was JSON-RPC
    status: int
    headers: httpx2.Headers
    body: bytes  # the body of an error status or a JSON answer; streams are left to the SDK


class Wire:
    """Every POST answer an httpx2 client received, recorded by its response hook."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(timeout=AGENT_TIMEOUT, event_hooks={"response": [self.record]})

    async def record(self, response: httpx2.Response) -> None:
        request = response.request
        if request.method != "POST":
            return
        sent = orjson.loads(request.content) if request.content else None
        rpc_method = sent.get("method") if isinstance(sent, dict) else None
        is_json = response.headers.get("content-type", "").startswith("application/json")
        body = await response.aread() if response.status_code >= 400 or is_json else b""
        self.exchanges.append(Exchange(rpc_method, response.status_code, response.headers, body))

    def tool_calls(self) -> list[Exchange]:
        return [exchange for exchange in self.exchanges if exchange.rpc_method == "tools/call"]


@asynccontextmanager
async def mcp_client(
    endpoint: str, wire: Wire, *, mode: str = "auto", **options: Any
) -> AsyncIterator[Client]:
    """The MCP SDK's streamable-HTTP client on ``endpoint``, its answers recorded on ``wire``.

    ``mode="legacy"`` speaks the handshake-era protocol (what 1.x clients speak); ``"auto"``
    is the 2.x default, which prefers the 2026-07-28 protocol when the server offers it.
    ``options`` go to the SDK's ``Client`` (its callbacks).
    """
    transport = streamable_http_client(endpoint, http_client=wire.client())
    async with Client(transport, mode=mode, **options) as client:
        yield client


def orders_failing_once(name: str) -> tuple[MCPServer, Counter[str]]:
    """An MCP server whose two tools fail their first call with ``-32603``, and how often
    each ran: ``place_order`` (no annotation) marks its error ``data.retryable: true``;
    ``cancel_order`` (annotated read-only) does not."""
    runs: Counter[str] = Counter()
    server = MCPServer(name)

    def failing_first_time(tool: str, data: dict[str, bool] | None) -> str:
        runs[tool] += 1
        if runs[tool] == 1:
            raise MCPError(-32603, "price feed warming up", data)
        return f"{tool} run {runs[tool]}"

    @server.tool()
    async def place_order(symbol: str) -> str:
        return failing_first_time("place_order", {"retryable": True})

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def cancel_order(symbol: str) -> str:
        return failing_first_time("cancel_order", None)

    return server, runs


@dataclass
class OwnError:
    """An answer of the sidecar's own, read the same whether it came as the envelope or, to
    a JSON-RPC request, as a JSON-RPC error (``status`` is then the one it stands for)."""

    status: int
    code: str
    retryable: bool
    details: dict[str, str]


def own_error(status: int, body: bytes) -> OwnError:
    document = orjson.loads(body)
    if "jsonrpc" in document:
        assert status == 200 and document["error"]["code"] == -32000, document
        data = dict(document["error"]["data"])
        meant, code = data.pop("status"), data.pop("code")
        data.pop("category")
        return OwnError(meant, code, data.pop("retryable"), data)
    error = document["error"]
    return OwnError(status, error["code"], error["retryable"], error["details"])


def leaf_errors(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, as the SDK's task groups raise them."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaf_errors(inner)]
    return [error]
