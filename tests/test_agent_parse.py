"""The agent's request bytes through the sidecar's own server protocol, without sockets:
an ``AgentConnection`` over a byte stream of this test's own, its handler recording what it
was given (method, headers, the whole body) as the proxy would forward it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.serve.httpserver import AgentConnection, upgrade_body_head
from sidecar.wire.buffers import BufferBudget
from sidecar.wire.headers import end_to_end_headers


class Stream:
    """What the server wrote back, and whether it closed."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = asyncio.get_running_loop().create_future()
        self.reading = True

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed.done()

    def close(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


@dataclass
class Seen:
    method: str
    path: str
    forwarded: list[tuple[str, str]]
    body: bytes


@dataclass
class Server:
    """What ``AgentConnection`` reads of its server (``httpserver.Serving``)."""

    seen: list[Seen] = field(default_factory=list)
    client_timeout_s: float = 60.0
    max_header_bytes: int = 2**16
    max_line_size: int = 8190
    max_field_size: int = 8190
    lingering_s: float = 1.0
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("test"))
    buffers: BufferBudget = field(default_factory=lambda: BufferBudget(2**24))
    agents: set[object] = field(default_factory=set)

    async def handler(self, request: AgentRequest) -> AgentReply:
        body = bytearray()
        while chunk := await request.content.readany():
            body += chunk
        forwarded = list(end_to_end_headers(request.headers).items())
        self.seen.append(Seen(request.method, request.raw_path, forwarded, bytes(body)))
        return AgentReply(200, body=b"ok")


async def serve(data: bytes, *, split: int | None = None) -> tuple[Server, bytes]:
    """``data`` as the agent sends it (in two reads when ``split``); what the handler saw and
    what went back, once the connection closed."""
    server = Server()
    connection = AgentConnection(server)
    stream = Stream()
    connection.connection_made(stream)  # type: ignore[arg-type]
    for piece in (data,) if split is None else (data[:split], data[split:]):
        connection.data_received(piece)
    await asyncio.wait_for(stream.closed, 5)
    return server, bytes(stream.written)


LAST = b"GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
# (name, an upgrade request with a body, the body the tool must get)
UPGRADES_WITH_A_BODY = [
    (
        "put-connection-upgrade",
        b"PUT /put HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: foo\r\n"
        b"Content-Length: 4\r\n\r\nbody",
        b"body",
    ),
    (
        "curl-http2-post-h2c",
        b"POST /post HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
        b"Content-Length: 4\r\n\r\nbody",
        b"body",
    ),
    (
        "chunked-upgrade",
        b"POST /post HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\nbo\r\n2\r\ndy\r\n0\r\n\r\n",
        b"body",
    ),
]


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [case[1:] for case in UPGRADES_WITH_A_BODY],
    ids=[case[0] for case in UPGRADES_WITH_A_BODY],
)
async def test_an_upgrade_with_a_body_is_read_as_an_ordinary_request_at_every_split(
    request_bytes, body
):
    data = request_bytes + LAST
    for split in range(len(data) + 1):
        server, written = await serve(data, split=split)
        assert [seen.body for seen in server.seen] == [body, b""], split
        forwarded = {name.lower() for name, _ in server.seen[0].forwarded}
        assert forwarded.isdisjoint({"upgrade", "connection", "http2-settings"})
        assert written.count(b"HTTP/1.1 200 OK\r\n") == 2


async def test_an_upgrade_without_a_body_is_answered_and_nothing_after_it_is_read():
    server, written = await serve(
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n" + LAST
    )
    assert [seen.path for seen in server.seen] == ["/ws"]
    assert written.count(b"HTTP/1.1 200 OK\r\n") == 1


async def test_a_bad_chunk_in_an_upgrade_body_is_refused():
    server, written = await serve(
        b"POST /post HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n4  \r\nbody\r\n0\r\n\r\n"
    )
    assert server.seen == []
    assert written.startswith(b"HTTP/1.1 400 ") or written.startswith(b"HTTP/1.0 400 ")


# Chunk-size lines RFC 9112 §7.1.1 does not allow: llhttp refuses them in an agent's body.
BAD_CHUNK_LINES = [b"4  ", b"4 ", b"4;", b"4; ", b" 4", b"0x4"]


@pytest.mark.parametrize("line", BAD_CHUNK_LINES)
async def test_an_agent_body_with_a_bad_chunk_line_never_reaches_the_handler(line):
    server, written = await serve(
        b"POST /post HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        + line
        + b"\r\nbody\r\n0\r\n\r\n"
    )
    assert [seen.body for seen in server.seen] == []
    assert b" 400 " in written.partition(b"\r\n")[0]


async def test_the_framing_head_of_an_upgrade_body():
    # A real connection: the compiled build checks the type of what a request is given.
    agent = AgentConnection(Server())

    def request(method: str, *headers: tuple[bytes, bytes]) -> AgentRequest:
        from aiohttp import HttpVersion11

        return AgentRequest(
            agent, method, "/", HttpVersion11, list(headers), keep_alive=True, remote=None
        )

    upgrade = (b"Upgrade", b"h2c")
    assert upgrade_body_head(request("POST", upgrade, (b"Content-Length", b"4"))) == (
        b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n"
    )
    assert upgrade_body_head(request("POST", upgrade, (b"Transfer-Encoding", b"chunked"))) == (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert upgrade_body_head(request("GET", upgrade)) is None
    assert upgrade_body_head(request("POST", upgrade, (b"Content-Length", b"0"))) is None
    assert upgrade_body_head(request("CONNECT", (b"Content-Length", b"4"))) is None


HOSTS = [
    (b"GET /x HTTP/1.1\r\n\r\n", b"400", "an HTTP/1.1 request without Host"),
    (
        b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"400",
        "a request with more than one Host",
    ),
    (b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n", b"200", "ok"),
    (b"GET /x HTTP/1.0\r\n\r\n", b"200", "ok"),  # HTTP/1.0 has no Host to require
]


@pytest.mark.parametrize(("head", "status", "said"), HOSTS)
async def test_a_request_without_exactly_one_host_is_refused_before_any_tool(head, status, said):
    server, written = await serve(head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert written.split(b" ", 2)[1] == status
    assert said.encode() in written.partition(b"\r\n\r\n")[2]
    assert len(server.seen) == (status == b"200")


async def test_a_head_refused_is_not_first_told_to_send_its_body():
    """The head is checked before an agent expecting ``100-continue`` is told to go on: a
    body that will be refused is never asked for."""
    head = (
        b"POST /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
        b"Expect: 100-continue\r\nContent-Length: 3\r\n\r\n"
    )
    server, written = await serve(head)
    assert written.startswith(b"HTTP/1.1 400 ")
    assert b"100 Continue" not in written
    assert server.seen == []


async def test_an_agent_expecting_100_continue_is_told_before_its_handler_reads():
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"
    server, written = await serve(
        head + b"abcGET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    assert written.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ")
    assert [seen.body for seen in server.seen] == [b"abc", b""]
