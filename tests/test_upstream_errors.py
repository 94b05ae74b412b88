"""When no upstream answer exists the agent gets a contract envelope, never a traceback."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import hang, scripted, unused_port
from tests.rawhttp import raw_exchange, raw_tool, read_request_head, reply_then


def envelope_of(body: bytes) -> dict:
    envelope = orjson.loads(body)
    assert envelope["success"] is False
    assert envelope["error"]["details"]["source"] == "sidecar"
    assert all(isinstance(value, str) for value in envelope["error"]["details"].values())
    return envelope["error"]


async def test_unreachable_upstream_gets_503_upstream_unreachable(make_sidecar):
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}")

    response = await sidecar.client.post("/tool", json={"q": 1})

    assert response.status == 503
    error = envelope_of(await response.read())
    assert error["code"] == "UPSTREAM_UNREACHABLE"
    assert error["category"] == "SERVICE_ERROR"
    # The sidecar spent its retries: the body says what x-should-retry says.
    assert error["retryable"] is False
    assert sidecar.metric("sidecar_upstream_attempts_total", route="default", status="error") >= 1


async def test_upstream_slower_than_the_per_try_timeout_gets_504(make_tool, make_sidecar):
    async def slow(request: web.Request) -> web.Response:
        await hang()

    sidecar = await make_sidecar(await make_tool(slow), per_try_timeout_ms=100, max_retries=0)

    response = await sidecar.client.get("/")

    assert response.status == 504
    assert envelope_of(await response.read())["code"] == "UPSTREAM_TIMEOUT"


def answering(head: bytes) -> bytes:
    return head + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (b"", "reset"),  # closed before any answer
        (
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a"',
            "reset",
        ),
        (
            b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\n"
            b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"a":',
            "reset",
        ),
        (b"NOT HTTP AT ALL\r\n\r\n", "the status line is malformed"),
        # Whole answers that could not reach the agent unchanged.
        (answering(b"HTTP/1.1 099 Odd"), "status 99 out of range"),
        (answering(b"HTTP/1.1 600 Beyond"), "status 600 out of range"),
        (answering(b"HTTP/1.1 200 OK\r\nX-Foo: caf\xe9"), "header X-Foo is not valid UTF-8"),
        (answering(b"HTTP/1.1 503 Busy\r\nX-Trace: \xff\xfe"), "header X-Trace is not valid UTF-8"),
        (answering(b"HTTP/1.1 200 \xff\xfe"), "reason phrase is not valid UTF-8"),
    ],
    ids=[
        "closed",
        "short-content-length",
        "truncated-chunked",
        "garbage",
        "status-099",
        "status-600",
        "latin-1-header",
        "binary-header",
        "binary-reason",
    ],
)
async def test_a_broken_answer_gets_502_saying_why(make_sidecar, reply, reason):
    async with raw_tool(reply_then(reply)) as url:
        sidecar = await make_sidecar(url, max_retries=0)
        response = await sidecar.client.get("/")

    assert response.status == 502
    error = envelope_of(await response.read())
    assert error["code"] == "UPSTREAM_RESET"
    assert error["details"]["reason"] == reason
    assert response.headers["X-Sidecar-Attempts"] == "1"


async def test_streamed_answer_cut_by_the_tool_is_cut_for_the_agent_too(make_sidecar):
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"
        )
        await writer.drain()
        await head_relayed.wait()  # then the tool goes: its answer ends there, cut

    head_relayed = asyncio.Event()
    async with raw_tool(cut) as url:
        sidecar = await make_sidecar(url)
        response = await sidecar.client.get("/file")
        head_relayed.set()
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_declared_body_over_the_hard_limit_gets_413_without_reaching_the_tool(
    make_tool, make_sidecar
):
    tool = await make_tool(scripted(lambda: web.json_response({})))
    sidecar = await make_sidecar(tool, max_body_bytes=1024, max_request_bytes=4096)

    response = await sidecar.client.post("/", data=os.urandom(8192))

    assert response.status == 413
    error = envelope_of(await response.read())
    assert error["code"] == "REQUEST_TOO_LARGE"
    assert error["category"] == "INPUT_ERROR"
    assert tool.seen == []


async def test_chunked_body_growing_past_the_hard_limit_gets_413(make_tool, make_sidecar):
    async def drain(request: web.Request) -> web.Response:
        return web.json_response({})

    tool = await make_tool(drain)
    sidecar = await make_sidecar(tool, max_body_bytes=1024, max_request_bytes=4096)

    async def chunks():
        for _ in range(16):
            yield os.urandom(1024)
            await asyncio.sleep(0.01)

    response = await sidecar.client.post("/", data=chunks())

    assert response.status == 413
    assert envelope_of(await response.read())["code"] == "REQUEST_TOO_LARGE"
    assert all(len(seen.body) <= 4096 for seen in tool.seen)


async def test_utf8_in_a_tools_header_and_reason_passes_unchanged(make_sidecar):
    head = b"HTTP/1.1 200 Tr\xc3\xa8s bien\r\nX-City: Z\xc3\xbcrich\r\n"

    async with raw_tool(reply_then(head + b"Content-Length: 0\r\n\r\n")) as url:
        sidecar = await make_sidecar(url)
        answered = await raw_exchange(
            sidecar.client.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )

    assert answered.startswith(head)
