"""Circuits per tool: one failing tool costs its own calls, never its neighbours'."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from structlog.testing import capture_logs

from sidecar.retry.guards.tools import MAX_TOOLS_PER_ROUTE, OVERFLOW_TOOL
from tests.conftest import FakeClock
from tests.wire import own_error

GUARDED = {
    "max_retries": 0,
    "circuit_failures": 3,
    "circuit_min_calls": 0,
    "circuit_open_ms": 30000,
}


async def rest_tool(request: web.Request) -> web.Response:
    """``/search`` is down; every other endpoint answers."""
    if request.path.startswith("/search"):
        return web.json_response({"error": "search index offline"}, status=503)
    return web.json_response({"success": True, "path": request.path})


def rpc_call(tool: str, call_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"q": "x"}},
    }


async def mcp_tool(request: web.Request) -> web.Response:
    """One MCP endpoint; its ``search`` tool sits behind a gateway answering 503."""
    call = await request.json()
    if call["params"]["name"] == "search":
        return web.json_response({"error": "upstream unavailable"}, status=503)
    result = {"content": [{"type": "text", "text": "4"}], "isError": False}
    return web.json_response({"jsonrpc": "2.0", "id": call["id"], "result": result})


async def test_a_failing_endpoint_opens_its_own_circuit_and_its_neighbours_keep_answering(
    make_tool, make_sidecar
):
    tool = await make_tool(rest_tool)
    sidecar = await make_sidecar(tool, clock=FakeClock(), **GUARDED)

    for _ in range(3):
        assert (await sidecar.client.get("/search?q=1")).status == 503
        assert (await sidecar.client.get("/calc?expr=2")).status == 200
    refused = await sidecar.client.get("/search?q=2")
    healthy = [await sidecar.client.get(path) for path in ("/calc", "/time", "/weather")]

    assert refused.status == 503
    error = (await refused.json())["error"]
    assert error["code"] == "CIRCUIT_OPEN"
    assert error["details"]["tool"] == "/search"
    assert [answer.status for answer in healthy] == [200, 200, 200]
    assert [seen.raw_path for seen in tool.seen].count("/search?q=2") == 0
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="/search") == 2
    assert (
        sidecar.registry.get_sample_value(
            "sidecar_circuit_state", {"route": "default", "tool": "/calc"}
        )
        == 0
    )


async def test_the_route_scope_keeps_one_circuit_for_every_endpoint(make_tool, make_sidecar):
    tool = await make_tool(rest_tool)
    sidecar = await make_sidecar(tool, clock=FakeClock(), circuit_scope="route", **GUARDED)

    for _ in range(3):
        await sidecar.client.get("/search")
    neighbour = await sidecar.client.get("/calc")

    assert neighbour.status == 503
    error = (await neighbour.json())["error"]
    assert error["code"] == "CIRCUIT_OPEN"
    assert "tool" not in error["details"]
    assert sidecar.metric("sidecar_circuit_state", route="default", tool="") == 2
    assert len(tool.seen) == 3


async def test_each_mcp_tool_on_one_path_has_its_own_circuit(make_tool, make_sidecar):
    tool = await make_tool(mcp_tool)
    sidecar = await make_sidecar(tool, clock=FakeClock(), **GUARDED)

    for n in range(3):
        assert (await sidecar.client.post("/mcp", json=rpc_call("search", n))).status == 503
    refused = await sidecar.client.post("/mcp", json=rpc_call("search", 9))
    answered = await sidecar.client.post("/mcp", json=rpc_call("calculator", 10))

    circuit_open = own_error(refused.status, await refused.read())
    assert (circuit_open.status, circuit_open.code) == (503, "CIRCUIT_OPEN")
    assert circuit_open.details["tool"] == "search"
    assert answered.status == 200
    assert (await answered.json())["result"]["content"][0]["text"] == "4"
    names = [json.loads(seen.body)["params"]["name"] for seen in tool.seen]
    assert names == ["search"] * 3 + ["calculator"]


async def test_paths_that_match_one_openapi_template_share_its_circuit(
    make_tool, make_sidecar, aiohttp_server
):
    async def items(request: web.Request) -> web.Response:
        if request.path.startswith("/items/"):
            return web.json_response({}, status=503)
        return web.json_response({"ok": True})

    schema = {
        "openapi": "3.1.0",
        "paths": {
            "/items/{item_id}": {"get": {"responses": {"200": {"description": "an item"}}}},
            "/health": {"get": {"responses": {"200": {"description": "up"}}}},
        },
    }

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(schema)

    schema_app = web.Application()
    schema_app.router.add_get("/openapi.json", openapi)
    schema_server = await aiohttp_server(schema_app)
    tool = await make_tool(items)
    routes = [
        {
            "name": "inventory",
            "prefix": "/",
            "upstream": tool.url,
            "schema": str(schema_server.make_url("/openapi.json")),
        }
    ]
    sidecar = await make_sidecar(None, routes=routes, clock=FakeClock(), **GUARDED)

    for item in (1, 2, 3):
        assert (await sidecar.client.get(f"/items/{item}")).status == 503
    refused = await sidecar.client.get("/items/4")
    health = await sidecar.client.get("/health")

    assert (await refused.json())["error"]["details"]["tool"] == "/items/{item_id}"
    assert health.status == 200
    assert len(tool.seen) == 4


async def test_circuits_per_route_are_capped_and_the_rest_share_one(make_tool, make_sidecar):
    tool = await make_tool(rest_tool)
    sidecar = await make_sidecar(tool)

    for n in range(MAX_TOOLS_PER_ROUTE + 5):
        assert (await sidecar.client.get(f"/calc/{n}")).status == 200

    tools = sidecar.label_values("tool")
    assert len(tools) == MAX_TOOLS_PER_ROUTE + 1
    assert OVERFLOW_TOOL in tools
    assert "/calc/0" in tools and f"/calc/{MAX_TOOLS_PER_ROUTE + 4}" not in tools


async def test_the_refusals_log_line_names_the_tool(make_tool, make_sidecar):
    tool = await make_tool(rest_tool)
    sidecar = await make_sidecar(tool, clock=FakeClock(), **GUARDED)

    with capture_logs() as logs:
        for _ in range(4):
            await sidecar.client.get("/search")

    refusals = [line for line in logs if line.get("event") == "circuit_refusals"]
    assert [(line["route"], line["tool"], line["count"]) for line in refusals] == [
        ("default", "/search", 1)
    ]
