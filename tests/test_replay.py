"""Replay safety: a call the agent made once never runs twice at the tool by the sidecar's doing.

Every test counts what the tool received, on the tool's side of the socket.
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest
from aiohttp import web

from sidecar.retry.replay import McpToolHints, mcp_call, mcp_safe
from tests.conftest import scripted, unused_port
from tests.rawhttp import raw_tool, read_request_head
from tests.wire import own_error

OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class ResetAfterReading:
    """A tool that reads each request whole and then drops the connection, ``resets`` times,
    and answers 200 after that."""

    def __init__(self, resets: int) -> None:
        self.resets = resets
        self.received = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            self.received += 1
            if self.received <= self.resets:
                return  # the connection closes without an answer: delivered, no head
            writer.write(OK_RESPONSE)
            await writer.drain()


async def test_a_delivered_post_without_an_answer_is_not_replayed(make_sidecar):
    tool = ResetAfterReading(resets=1)
    async with raw_tool(tool) as url:
        sidecar = await make_sidecar(url)
        response = await sidecar.client.post("/charge", json={"amount": 10})
        body = await response.json()

    assert tool.received == 1
    assert response.status == 502
    assert body["error"]["code"] == "UPSTREAM_RESET"
    assert body["error"]["details"] == {
        "reason": "reset",
        "delivered": "maybe",
        "source": "sidecar",
    }
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert response.headers["X-Sidecar-Trail"] == "reset stop=not_replayable"
    assert response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("method", "settings", "headers"),
    [
        ("PUT", {}, {}),
        ("DELETE", {}, {}),
        ("POST", {}, {"Idempotency-Key": "agent-key-1"}),
        ("POST", {"idempotency_header": "X-Request-Key"}, {"X-Request-Key": "agent-key-1"}),
        ("POST", {"replay_delivered": "always"}, {}),
        (
            "POST",
            {"routes": [{"name": "ledger", "upstream": "URL", "idempotent": True}]},
            {},
        ),
    ],
    ids=["put", "delete", "agent-key", "agent-key-custom-header", "always", "idempotent-route"],
)
async def test_a_delivered_call_that_is_safe_to_repeat_is_replayed(
    make_sidecar, method, settings, headers
):
    tool = ResetAfterReading(resets=1)
    async with raw_tool(tool) as url:
        if "routes" in settings:
            settings = {"routes": [{**settings["routes"][0], "upstream": url}]}
            sidecar = await make_sidecar(**settings)
        else:
            sidecar = await make_sidecar(url, **settings)
        response = await sidecar.client.request(method, "/charge", json={"n": 1}, headers=headers)

    assert response.status == 200
    assert response.headers["X-Sidecar-Outcome"] == "recovered"
    assert tool.received == 2 == int(response.headers["X-Sidecar-Attempts"])


async def test_a_post_the_tool_is_still_working_on_is_not_replayed(make_tool, make_sidecar):
    started: list[float] = []

    async def slow(request: web.Request) -> web.Response:
        started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(1)
        return web.json_response({"done": True})

    tool = await make_tool(slow)
    sidecar = await make_sidecar(tool, per_try_timeout_ms=200)

    response = await sidecar.client.post("/report", json={"n": 1})
    body = await response.json()

    assert len(started) == 1
    assert response.status == 504
    assert body["error"]["code"] == "UPSTREAM_TIMEOUT"
    assert body["error"]["details"]["delivered"] == "maybe"
    assert response.headers["X-Sidecar-Trail"] == "timeout stop=not_replayable"


async def test_a_post_that_never_reached_the_tool_is_sent_again(make_sidecar):
    """Connection refused: nothing ran, so sending it again runs nothing twice."""
    port = unused_port()
    tool = ResetAfterReading(resets=0)
    servers: list[asyncio.Server] = []

    async def answer_quietly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await tool(reader, writer)
        writer.close()

    async def start_the_tool_meanwhile(seconds: float) -> None:
        if not servers:
            servers.append(await asyncio.start_server(answer_quietly, "127.0.0.1", port))

    sidecar = await make_sidecar(f"http://127.0.0.1:{port}", sleep=start_the_tool_meanwhile)
    try:
        response = await sidecar.client.post("/charge", json={"amount": 1})
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()

    assert response.status == 200
    assert response.headers["X-Sidecar-Trail"].startswith("connect_error backoff=")
    assert tool.received == 1


async def test_the_first_event_after_keepalive_comments_is_what_counts(make_tool, make_sidecar):
    """An MCP server may send ': ping' before its answer; a ping is not the answer."""

    async def pings_then_error(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": ping\n\n")
        await response.write(b": ping\n\n")
        error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "broke"}}
        await response.write(b"event: message\ndata: " + orjson.dumps(error) + b"\n\n")
        await response.write_eof()
        return response

    tool = await make_tool(pings_then_error)
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "x"})

    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert b"-32603" in await response.read()
    assert len(tool.seen) == 1


async def test_an_event_stream_slower_than_the_inspection_window_is_relayed_once(
    make_tool, make_sidecar
):
    """An MCP tool that takes longer than the window: its answer streams, it runs once."""
    release = asyncio.Event()

    async def slow_tool(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await release.wait()
        await response.write(b'event: message\ndata: {"jsonrpc": "2.0", "id": 1, "result": {}}\n\n')
        await response.write_eof()
        return response

    tool = await make_tool(slow_tool)
    sidecar = await make_sidecar(tool, per_try_timeout_ms=100, inspect_timeout_ms=100)

    response = await sidecar.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "x"})
    assert response.status == 200
    assert response.headers["X-Sidecar-Attempts"] == "1"
    release.set()
    assert b'"result"' in await response.read()
    assert len(tool.seen) == 1


def tools_list(tools: list[dict]) -> bytes:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}})
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def test_mcp_tools_the_server_annotated_safe_are_replayed_and_others_are_not(
    make_sidecar,
):
    calls: list[str] = []
    resets_left = {"lookup": 1, "pay": 1}

    async def mcp_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            request = orjson.loads(await reader.readexactly(length))
            if request["method"] == "tools/list":
                writer.write(
                    tools_list(
                        [
                            {"name": "lookup", "annotations": {"readOnlyHint": True}},
                            {"name": "pay", "annotations": {"destructiveHint": True}},
                        ]
                    )
                )
                await writer.drain()
                continue
            tool = request["params"]["name"]
            calls.append(tool)
            if resets_left[tool]:
                resets_left[tool] -= 1
                return
            writer.write(OK_RESPONSE)
            await writer.drain()

    def call(tool: str) -> dict:
        return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool}}

    async with raw_tool(mcp_server) as url:
        sidecar = await make_sidecar(url)
        listed = await sidecar.client.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        )
        assert listed.status == 200
        lookup = await sidecar.client.post("/mcp", json=call("lookup"))
        pay = await sidecar.client.post("/mcp", json=call("pay"))

    assert lookup.headers["X-Sidecar-Outcome"] == "recovered"
    assert own_error(pay.status, await pay.read()).code == "UPSTREAM_RESET"
    assert pay.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert calls == ["lookup", "lookup", "pay"]


async def test_no_request_reaches_the_tool_that_the_sidecar_does_not_count(make_sidecar):
    """A client may resend a GET once, silently, on a kept-alive connection that drops
    (aiohttp's does); the sidecar's must not."""
    received = 0

    async def first_answer_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal received
        answered = False
        while True:
            await read_request_head(reader)
            received += 1
            if answered:
                return  # the kept-alive connection drops under the next request
            writer.write(OK_RESPONSE)
            await writer.drain()
            answered = True

    async with raw_tool(first_answer_then_drop) as url:
        sidecar = await make_sidecar(url)
        attempts = 0
        for _ in range(3):
            response = await sidecar.client.get("/item")
            assert response.status == 200
            attempts += int(response.headers["X-Sidecar-Attempts"])

    assert received == attempts
    assert sidecar.metric("sidecar_upstream_attempts_total", route="default", status="error") == (
        attempts - 3
    )


async def test_the_tools_own_should_retry_header_stays_on_success_and_is_overruled_on_give_up(
    make_tool, make_sidecar
):
    answers = iter([200, 503, 503])

    async def tool_handler(request: web.Request) -> web.Response:
        return web.json_response({}, status=next(answers), headers={"x-should-retry": "true"})

    sidecar = await make_sidecar(await make_tool(tool_handler), max_retries=1)

    ok = await sidecar.client.get("/")
    given_up = await sidecar.client.get("/")

    assert ok.headers["x-should-retry"] == "true"
    assert given_up.headers["X-Sidecar-Outcome"] == "exhausted"
    assert given_up.headers.getall("x-should-retry") == ["false"]


async def test_the_idempotency_key_can_be_turned_off(make_tool, make_sidecar):
    tool = await make_tool(scripted(lambda: web.json_response({})))
    sidecar = await make_sidecar(tool, idempotency_header="off")

    await sidecar.client.post("/", json={})

    assert "Idempotency-Key" not in tool.seen[0].headers


_ANNOTATED = {"result": {"tools": [{"name": "lookup", "annotations": {"readOnlyHint": True}}]}}


@pytest.mark.parametrize(
    ("body", "safe"),
    [
        # MCP's own reads and its session's set-up: safe whatever the server said of its tools.
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}', True),
        (b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}', True),
        (b'{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"a://b"}}', True),
        (b'{"jsonrpc":"2.0","id":4,"method":"server/discover"}', True),
        (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', True),
        # A tool's call goes by the tool's own annotations, never by the method.
        (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"lookup"}}', True),
        (b'{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"charge"}}', False),
        (b'{"jsonrpc":"2.0","id":7,"method":"tools/call"}', False),
        # A method MCP does not name is not known to be safe; nor is a body that is no call.
        (b'{"jsonrpc":"2.0","id":8,"method":"sampling/createMessage"}', False),
        (b'{"jsonrpc":"2.0","id":9,"method":"x/deleteEverything"}', False),
        (b'{"method":"tools/list"}', False),
        (b"not json", False),
    ],
)
def test_which_mcp_requests_are_safe_to_run_twice(body: bytes, safe: bool) -> None:
    hints = McpToolHints()
    hints.learn(_ANNOTATED)
    assert mcp_safe(mcp_call(body), hints) is safe
