"""Connections to the tool are kept for the next request, and only when that is safe."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import trustme
from aiohttp import web

from tests.conftest import hang, scripted
from tests.rawhttp import raw_tool, read_request_head


@dataclass
class KeptAliveTool:
    """Answers the n-th request with ``replies[n]`` on whatever connection it comes; records
    which connection carried which request. After a ``Connection: close`` reply it stops
    reading that connection but leaves it open, as a slow-closing server would."""

    replies: list[bytes]
    requests_by_connection: list[list[bytes]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: list[bytes] = []
        self.requests_by_connection.append(seen)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head.split(b" ", 2)[0] + b" " + head.split(b" ", 2)[1])
            length = _content_length(head)
            if length:
                await reader.readexactly(length)
            served = sum(len(requests) for requests in self.requests_by_connection)
            reply = self.replies[min(served, len(self.replies)) - 1]
            writer.write(reply)
            await writer.drain()
            if b"connection: close" in reply.lower():
                await hang()


def _content_length(head: bytes) -> int:
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


JSON_OK = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'
)


async def test_one_connection_carries_requests_one_after_another(make_sidecar):
    tool = KeptAliveTool(
        [
            JSON_OK,
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
            b"Trailer: X-Checksum\r\n\r\n5\r\nhello\r\n0\r\nX-Checksum: 1\r\n\r\n",
            JSON_OK,
        ]
    )
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url)

        first = await sidecar.client.post("/a", json={"q": 1})
        head = await sidecar.client.head("/b")
        empty = await sidecar.client.delete("/c")
        chunked = await sidecar.client.get("/d")
        last = await sidecar.client.post("/e", json={"q": 2})

        assert (first.status, await first.read()) == (200, b'{"ok":true}')
        assert (head.status, await head.read()) == (200, b"")
        assert (empty.status, await empty.read()) == (204, b"")
        assert (chunked.status, await chunked.read()) == (200, b"hello")
        assert (last.status, await last.read()) == (200, b'{"ok":true}')
    assert tool.requests_by_connection == [
        [b"POST /a", b"HEAD /b", b"DELETE /c", b"GET /d", b"POST /e"]
    ]


async def test_an_answer_saying_connection_close_ends_that_connection(make_sidecar):
    closing = JSON_OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    tool = KeptAliveTool([closing, JSON_OK])
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=2000, max_retries=0)

        first = await sidecar.client.post("/a", json={"q": 1})
        second = await sidecar.client.post("/b", json={"q": 2})

        assert (first.status, await first.read()) == (200, b'{"ok":true}')
        assert (second.status, second.headers["X-Sidecar-Attempts"]) == (200, "1")
    assert tool.requests_by_connection == [[b"POST /a"], [b"POST /b"]]


async def test_a_post_the_kept_connection_drops_under_is_not_sent_again(make_sidecar):
    received = 0

    async def answer_once_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal received
        await read_request_head(reader)
        received += 1
        writer.write(JSON_OK)
        await writer.drain()
        await read_request_head(reader)  # the next request, on the same connection
        received += 1

    async with raw_tool(answer_once_then_drop) as url:
        sidecar = await make_sidecar(url)
        first = await sidecar.client.post("/pay", data=b"{}")
        second = await sidecar.client.post("/pay", data=b"{}")

        assert first.status == 200
        assert second.status == 502
        error = (await second.json())["error"]
        assert (error["code"], error["details"]["delivered"]) == ("UPSTREAM_RESET", "maybe")
        assert second.headers["X-Sidecar-Attempts"] == "1"
    assert received == 2


async def test_an_https_tool_is_reached_only_with_a_certificate_the_sidecar_trusts(
    make_tool, make_sidecar, monkeypatch, tmp_path
):
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    tool = await make_tool(scripted(lambda: web.json_response({"ok": True})), ssl=server_context)
    assert tool.url.startswith("https://")

    untrusting = await make_sidecar(tool, max_retries=0)
    refused = await untrusting.client.post("/a", json={"q": 1})

    trust_store = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(trust_store))
    monkeypatch.setenv("SSL_CERT_FILE", str(trust_store))
    trusting = await make_sidecar(tool, max_retries=0)
    first = await trusting.client.post("/b", json={"q": 2})
    second = await trusting.client.post("/c", json={"q": 3})

    assert refused.status == 503
    assert (await refused.json())["error"]["details"]["reason"] == "connect_error"
    assert (first.status, await first.json()) == (200, {"ok": True})
    assert (second.status, await second.json()) == (200, {"ok": True})
    assert [seen.raw_path for seen in tool.seen] == ["/b", "/c"]
    assert tool.seen[0].peer == tool.seen[1].peer  # one TLS connection carried both
