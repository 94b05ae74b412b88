"""Every answer the sidecar makes itself carries the envelope and the ``X-Sidecar-*`` report,
and echoes nothing of what the agent sent."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from tests.conftest import unused_port
from tests.rawhttp import raw_exchange

SECRET = b"sk-live-0123456789"


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def parse(answer: bytes) -> tuple[bytes, dict[str, str], dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status_line.encode(), headers, json.loads(body)["error"]


@pytest.mark.parametrize(
    ("request_bytes", "status_line", "code"),
    [
        (
            b"GET /" + b"a" * 70_000 + b"?key=" + SECRET + b" HTTP/1.1\r\nHost: a\r\n\r\n",
            b"414 Request-URI Too Long",
            "URI_TOO_LONG",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + SECRET + b"a" * 70_000 + b"\r\n\r\n",
            b"431 Request Header Fields Too Large",
            "HEADERS_TOO_LARGE",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\n"
            + b"".join(b"X-Part-%d: %s\r\n" % (n, b"b" * 8000) for n in range(9))
            + b"\r\n",
            b"431 Request Header Fields Too Large",
            "HEADERS_TOO_LARGE",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
            b"X-Key: " + SECRET + b"\r\n\r\n0\r\n\r\n",
            b"400 Bad Request",
            "BAD_REQUEST",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}",
            b"417 Expectation Failed",
            "EXPECTATION_FAILED",
        ),
        (
            b"GET /a/../../etc HTTP/1.1\r\nHost: a\r\n\r\n",
            b"400 Bad Request",
            "BAD_REQUEST",
        ),
    ],
    ids=[
        "request-line-over-the-limit",
        "header-line-over-the-limit",
        "header-section-over-the-limit",
        "smuggling-attempt",
        "unknown-expectation",
        "dot-segment",
    ],
)
async def test_a_refused_request_gets_the_envelope_and_the_report(
    make_tool, make_sidecar, request_bytes, status_line, code
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(sidecar.client.port, request_bytes, until_closed=True)

    got_status, headers, error = parse(answer)
    # aiohttp answers a request it could not parse as HTTP/1.0: it never learned the version.
    assert got_status.split(b" ", 1)[1] == status_line
    assert error["code"] == code
    assert headers["X-Sidecar-Attempts"] == "0"
    assert headers["X-Sidecar-Outcome"] == "not-retryable"
    assert headers["X-Sidecar-Trail"] == code.lower()
    assert headers["x-should-retry"] == "false"
    assert headers["Content-Type"] == "application/json"
    assert "Server" not in headers
    assert SECRET not in answer
    assert tool.seen == []


async def test_a_head_just_under_the_limit_reaches_the_tool(make_tool, make_sidecar):
    """Envoy takes 60 KiB of headers by default; aiohttp alone would refuse 8 KiB a line."""
    tool = await make_tool(ok, max_line_size=65536, max_field_size=65536)
    sidecar = await make_sidecar(tool)

    async with sidecar.client.get("/" + "p" * 30_000, headers={"X-Big": "v" * 30_000}) as answer:
        assert answer.status == 200

    assert tool.seen[0].headers["X-Big"] == "v" * 30_000
    assert tool.seen[0].raw_path == "/" + "p" * 30_000


async def test_the_limit_is_a_setting(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool, max_header_bytes=4096)

    async with sidecar.client.get("/", headers={"X-Big": "v" * 5000}) as answer:
        assert answer.status == 431
        assert answer.headers["X-Sidecar-Trail"] == "headers_too_large"


async def test_no_route_and_overload_answers_carry_the_report(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url}]
    )

    async with sidecar.client.get("/nowhere") as answer:
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "NO_ROUTE"
        assert answer.headers["X-Sidecar-Attempts"] == "0"
        assert answer.headers["X-Sidecar-Outcome"] == "not-retryable"
        assert answer.headers["X-Sidecar-Trail"] == "no_route"
        assert "Server" not in answer.headers


RPC_CALL = {"jsonrpc": "2.0", "id": "call-7", "method": "tools/call", "params": {"name": "x"}}


async def test_an_mcp_request_the_sidecar_gives_up_on_gets_a_json_rpc_error_for_its_id(
    make_sidecar,
):
    """An MCP client reads an HTTP error status as a broken transport, which may end its
    session; a JSON-RPC error for the call's id is that one call's answer."""
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}", max_retries=1)

    answer = await sidecar.client.post("/mcp", json=RPC_CALL)

    assert answer.status == 200
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["X-Sidecar-Outcome"] == "unreachable"
    assert answer.headers["x-should-retry"] == "false"
    body = await answer.json()
    assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", "call-7", -32000)
    assert body["error"]["message"] == "could not connect to the tool"
    assert body["error"]["data"] == {
        "status": 503,
        "code": "UPSTREAM_UNREACHABLE",
        "category": "SERVICE_ERROR",
        "retryable": False,
        "reason": "connect_error",
        "source": "sidecar",
    }


async def test_a_json_rpc_notification_keeps_the_envelope_and_its_status(make_sidecar):
    """A notification has no id to answer: MCP asks for an HTTP error status then."""
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}", max_retries=0)

    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    answer = await sidecar.client.post("/mcp", json=notification)

    assert answer.status == 503
    assert (await answer.json())["error"]["code"] == "UPSTREAM_UNREACHABLE"


async def test_the_body_says_retryable_false_when_the_header_says_no_retry(make_sidecar):
    """0.5's answers said ``x-should-retry: false`` and ``"retryable": true`` at once."""
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}", max_retries=0)

    gave_up = await sidecar.client.post("/x", json={})

    assert (gave_up.status, gave_up.headers["x-should-retry"]) == (503, "false")
    assert (await gave_up.json())["error"]["retryable"] is False
