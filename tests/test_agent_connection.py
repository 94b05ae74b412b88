"""The agent's connection as the sidecar's own server keeps it: pipelined requests answered
in order, keep-alive as each HTTP version asks, and nothing parsed past a tunnel."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from tests.rawhttp import raw_exchange
from tests.test_agent_parse import UPGRADES_WITH_A_BODY


async def path_echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response({"path": request.path, "body": body.decode()})


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One answer with a ``Content-Length``: status line, headers, body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    status_line, *lines = head[:-4].decode().split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=5)
    return status_line.encode(), headers, body


async def test_pipelined_requests_are_answered_in_the_order_they_came(make_tool, make_sidecar):
    tool = await make_tool(path_echo)
    sidecar = await make_sidecar(tool)
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(
        b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n"
        b"POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /third HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )

    answers = [await read_answer(reader) for _ in range(3)]
    rest = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()

    assert [status for status, _, _ in answers] == [b"HTTP/1.1 200 OK"] * 3
    assert [body for _, _, body in answers] == [
        b'{"path": "/first", "body": ""}',
        b'{"path": "/second", "body": "hello"}',
        b'{"path": "/third", "body": ""}',
    ]
    assert answers[2][1]["connection"] == "close"
    assert rest == b""  # closed after the answer the agent asked to be the last
    assert [seen.raw_path for seen in tool.seen] == ["/first", "/second", "/third"]


async def test_a_kept_connection_carries_the_next_request(make_tool, make_sidecar):
    tool = await make_tool(path_echo)
    sidecar = await make_sidecar(tool)
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)

    writer.write(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n")
    _, first, _ = await read_answer(reader)
    writer.write(b"GET /two HTTP/1.1\r\nHost: a\r\n\r\n")
    _, second, body = await read_answer(reader)
    writer.close()

    assert "connection" not in first and "connection" not in second
    assert body == b'{"path": "/two", "body": ""}'
    assert {seen.peer for seen in tool.seen} == {tool.seen[0].peer}  # one upstream too


async def test_http_1_0_closes_unless_asked_to_keep_alive(make_tool, make_sidecar):
    tool = await make_tool(path_echo)
    sidecar = await make_sidecar(tool)

    closed = await raw_exchange(
        sidecar.client.port, b"GET /old HTTP/1.0\r\n\r\n", until_closed=True
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(b"GET /kept HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    status, headers, _ = await read_answer(reader)
    writer.write(b"GET /again HTTP/1.0\r\n\r\n")
    again, _, body = await read_answer(reader)
    writer.close()

    assert closed.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"\r\nConnection:" not in closed.partition(b"\r\n\r\n")[0]
    assert (status, headers["connection"]) == (b"HTTP/1.0 200 OK", "keep-alive")
    assert (again, body) == (b"HTTP/1.0 200 OK", b'{"path": "/again", "body": ""}')


async def test_bytes_after_a_connect_are_never_read_as_a_request(make_tool, make_sidecar):
    tool = await make_tool(path_echo)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(
        sidecar.client.port,
        b"CONNECT tool.example:443 HTTP/1.1\r\nHost: tool.example:443\r\n\r\n"
        b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        until_closed=True,
    )

    assert answer.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert answer.count(b"HTTP/1.1 ") == 1
    assert tool.seen == []


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [case[1:] for case in UPGRADES_WITH_A_BODY],
    ids=[case[0] for case in UPGRADES_WITH_A_BODY],
)
async def test_an_upgrade_with_a_body_reaches_the_tool_intact_and_not_upgraded(
    make_tool, make_sidecar, request_bytes, body
):
    # Envoy forwards such a request; llhttp stops at its body. The sidecar does not upgrade:
    # the hop-by-hop fields go, the body is forwarded, and the connection carries on.
    tool = await make_tool(path_echo)
    sidecar = await make_sidecar(tool)
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(request_bytes + b"GET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")

    answers = [await read_answer(reader) for _ in range(2)]
    writer.close()

    assert [status for status, _, _ in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert [seen.body for seen in tool.seen] == [body, b""]
    for name in ("Upgrade", "HTTP2-Settings"):
        assert name not in tool.seen[0].headers
    assert tool.seen[0].headers.get("Connection") != "upgrade"


@pytest.mark.parametrize("line", [b"4  ", b"4;"])
async def test_an_agent_chunk_size_line_the_grammar_refuses_never_reaches_the_tool(
    make_tool, make_sidecar, line
):
    tool = await make_tool(path_echo)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(
        sidecar.client.port,
        b"POST /post HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        + line
        + b"\r\nbody\r\n0\r\n\r\n",
        until_closed=True,
    )

    assert answer.startswith(b"HTTP/1.0 400 ") or answer.startswith(b"HTTP/1.1 400 ")
    assert tool.seen == []
