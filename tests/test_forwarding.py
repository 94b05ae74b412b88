"""The sidecar as a plain reverse proxy: what the tool and the agent see, byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os

from aiohttp import web
from yarl import URL


async def echo_json(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def test_method_path_query_headers_and_body_reach_the_tool_unchanged(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)
    body = b'{"city": "Tokyo", "lat": 35.6,   "units":"metric"}'

    raw_target = "/api/v1/items%2Fx/a%20b/%7Euser?q=a%20b&q=c&empty=&%7E=1&x=%2f"
    response = await sidecar.client.session.request(
        "PATCH",
        URL(f"http://127.0.0.1:{sidecar.client.port}{raw_target}", encoded=True),
        data=body,
        headers=[
            ("Content-Type", "application/json"),
            ("X-Custom", "one"),
            ("X-Custom", "two"),
            ("Authorization", "Bearer secret-token"),
        ],
    )

    assert response.status == 200
    [seen] = tool.seen
    assert seen.method == "PATCH"
    assert seen.raw_path == raw_target
    assert seen.body == body
    assert seen.headers.getall("X-Custom") == ["one", "two"]
    assert seen.headers["Authorization"] == "Bearer secret-token"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["Content-Length"] == str(len(body))


async def test_tool_answer_status_reason_headers_and_body_reach_the_agent_unchanged(
    make_tool, make_sidecar
):
    async def answer(request: web.Request) -> web.Response:
        response = web.Response(
            status=418, reason="I Am A Teapot Today", body=b"\x00\x01not json\xff"
        )
        response.headers["Content-Type"] = "application/x-teapot"
        response.headers.add("Set-Cookie", "a=1")
        response.headers.add("Set-Cookie", "b=2")
        response.headers["X-Tool"] = "yes"
        return response

    sidecar = await make_sidecar(await make_tool(answer))

    response = await sidecar.client.get("/brew")

    assert response.status == 418
    assert response.reason == "I Am A Teapot Today"
    assert await response.read() == b"\x00\x01not json\xff"
    assert response.headers["Content-Type"] == "application/x-teapot"
    assert response.headers.getall("Set-Cookie") == ["a=1", "b=2"]
    assert response.headers["X-Tool"] == "yes"


async def test_hop_by_hop_headers_are_dropped_in_both_directions(make_tool, make_sidecar):
    async def answer(request: web.Request) -> web.Response:
        return web.Response(
            text="ok",
            headers={
                "Connection": "X-Tool-Hop",
                "X-Tool-Hop": "private",
                "Keep-Alive": "timeout=5",
                "Proxy-Authenticate": "Basic",
                "X-Tool-End": "kept",
            },
        )

    tool = await make_tool(answer)
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get(
        "/",
        headers={
            "Connection": "keep-alive, X-Agent-Hop",
            "X-Agent-Hop": "private",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "Upgrade": "websocket",
            "X-Agent-End": "kept",
        },
    )

    seen = tool.seen[0].headers
    for name in ("X-Agent-Hop", "Keep-Alive", "TE", "Proxy-Authorization", "Upgrade"):
        assert name not in seen, name
    assert seen["X-Agent-End"] == "kept"
    for name in ("X-Tool-Hop", "Keep-Alive", "Proxy-Authenticate"):
        assert name not in response.headers, name
    assert response.headers["X-Tool-End"] == "kept"


async def test_forwarded_headers_and_request_id(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)

    await sidecar.client.get("/", headers={"X-Forwarded-For": "203.0.113.7"})
    await sidecar.client.get("/", headers={"X-Request-ID": "agent-chose-this"})

    first, second = (seen.headers for seen in tool.seen)
    assert first["X-Forwarded-For"] == "203.0.113.7, 127.0.0.1"
    assert second["X-Forwarded-For"] == "127.0.0.1"
    assert first["X-Forwarded-Proto"] == "http"
    assert first["X-Forwarded-Host"] == f"127.0.0.1:{sidecar.client.port}"
    assert len(first["X-Request-ID"]) == 32
    assert second["X-Request-ID"] == "agent-chose-this"


async def test_control_headers_are_consumed_not_forwarded(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)

    await sidecar.client.get(
        "/",
        headers={
            "X-Sidecar-Max-Retries": "1",
            "X-Sidecar-Intent": "weather in Tokyo",
            "x-sidecar-anything": "else",
        },
    )

    assert not [name for name in tool.seen[0].headers if name.lower().startswith("x-sidecar-")]


async def test_no_headers_are_invented_for_the_tool(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)

    await sidecar.client.post("/", data=b"raw", skip_auto_headers=["Content-Type"])

    seen = tool.seen[0].headers
    assert "Content-Type" not in seen
    assert "User-Agent" in seen  # the agent's own, from its client
    assert seen["User-Agent"].startswith("Python/")


async def test_gzip_answers_stay_gzip_byte_for_byte(make_tool, make_sidecar):
    small = gzip.compress(b'{"success": true, "data": {"temp": 21}}')
    large = gzip.compress(os.urandom(600 * 1024))

    async def answer(request: web.Request) -> web.Response:
        body = large if request.path == "/large" else small
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    sidecar = await make_sidecar(await make_tool(answer))

    for path, expected in (("/small", small), ("/large", large)):
        response = await sidecar.client.get(path, headers={"Accept-Encoding": "gzip"})
        assert response.headers["Content-Encoding"] == "gzip"
        assert await response.read() == expected


async def test_five_mebibyte_bodies_both_ways(make_tool, make_sidecar):
    upload = os.urandom(5 * 1024 * 1024)
    download = os.urandom(5 * 1024 * 1024)

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=download, content_type="application/octet-stream")

    tool = await make_tool(answer)
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.post("/upload", data=upload)

    assert hashlib.sha256(tool.seen[0].body).digest() == hashlib.sha256(upload).digest()
    assert hashlib.sha256(await response.read()).digest() == hashlib.sha256(download).digest()


async def test_bodies_over_the_buffer_limit_stream_through_unchanged(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool, max_body_bytes=1024)
    upload = os.urandom(300 * 1024)

    response = await sidecar.client.post("/upload", data=upload)

    assert response.status == 200
    assert tool.seen[0].body == upload


async def test_chunked_request_bodies_arrive_whole(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)
    parts = [b'{"items": [', b"1, 2, 3", b"]}"]

    async def chunks():
        for part in parts:
            yield part

    response = await sidecar.client.post("/", data=chunks())

    assert response.status == 200
    assert tool.seen[0].body == b"".join(parts)


async def test_head_204_and_304_carry_no_body_and_keep_their_headers(make_tool, make_sidecar):
    async def answer(request: web.Request) -> web.Response:
        if request.method == "HEAD":
            return web.Response(body=b"x" * 1234, content_type="application/json")
        if request.path == "/empty":
            return web.Response(status=204, headers={"X-Done": "yes"})
        return web.Response(status=304, headers={"ETag": '"v1"'})

    tool = await make_tool(answer)
    sidecar = await make_sidecar(tool)

    head = await sidecar.client.head("/thing")
    assert head.status == 200
    assert head.headers["Content-Length"] == "1234"
    assert await head.read() == b""

    no_content = await sidecar.client.delete("/empty")
    assert no_content.status == 204
    assert no_content.headers["X-Done"] == "yes"
    assert await no_content.read() == b""

    not_modified = await sidecar.client.get("/cached", headers={"If-None-Match": '"v1"'})
    assert not_modified.status == 304
    assert not_modified.headers["ETag"] == '"v1"'
    assert tool.seen[2].headers["If-None-Match"] == '"v1"'


async def test_upstream_connections_are_pooled_across_requests(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)

    for _ in range(5):
        response = await sidecar.client.get("/")
        await response.read()

    assert len({seen.peer for seen in tool.seen}) == 1


async def test_an_agent_expecting_100_continue_is_told_to_send_its_body(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    body = b'{"city": "Tokyo"}'
    writer.write(
        b"POST /weather HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    writer.write(body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    writer.close()

    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert head.startswith(b"HTTP/1.1 200 ")
    assert tool.seen[0].body == body
    assert "Expect" not in tool.seen[0].headers


async def test_an_expectation_other_than_100_continue_is_refused(make_tool, make_sidecar):
    tool = await make_tool(echo_json)
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.post("/", data=b"{}", headers={"Expect": "teapot"})

    assert response.status == 417
    assert tool.seen == []
