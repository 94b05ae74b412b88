"""Wire conformance: a tool's bytes reach only the request they answer, exactly or not at all.

A hostile (or buggy) tool answers ``/hostile`` with exact bytes; every other path gets a
valid answer that names its path. After each hostile answer, innocent requests follow on
a pool of one connection, so any byte the hostile answer left behind would become their
answer. Every innocent request must get its own answer; the hostile one must be relayed
byte-exact, or refused as ``502 UPSTREAM_RESET`` (not retried, counted so); and the
connection that carried anything unexpected must carry nothing more.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.rawhttp import raw_exchange, raw_tool

SMUGGLED = b"HTTP/1.1 418 SMUGGLED\r\nX-Smuggled: yes\r\nX-Pad: "


def innocent_answer(path: bytes) -> bytes:
    body = json.dumps({"path": path.decode()}).encode()
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Answer-For: %s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body)
    )


@dataclass
class HostileTool:
    """Answers ``/hostile`` with ``pieces`` written one by one, anything else validly.

    ``connections`` holds the request paths each connection carried, in order.
    """

    pieces: list[bytes]
    connections: list[list[bytes]] = field(default_factory=list)

    @property
    def paths(self) -> list[bytes]:
        return [path for carried in self.connections for path in carried]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        carried: list[bytes] = []
        self.connections.append(carried)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            carried.append(path)
            length = _declared_length(head)
            if length:
                await reader.readexactly(length)
            if path.startswith(b"/hostile"):
                for piece in self.pieces:
                    writer.write(piece)
                    await writer.drain()
            else:
                writer.write(innocent_answer(path))
                await writer.drain()


def _declared_length(head: bytes) -> int:
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


async def assert_innocents_get_their_own(sidecar, count: int = 6) -> None:
    """One after another, then all at once: each innocent request gets its own answer."""

    async def innocent(n: int) -> None:
        path = f"/innocent/{n}"
        async with sidecar.client.get(path) as response:
            body = await response.read()
            assert response.status == 200, (path, response.status, body)
            assert response.headers["X-Answer-For"] == path
            assert "X-Smuggled" not in response.headers
            assert json.loads(body) == {"path": path}

    for n in range(count):
        await innocent(n)
    await asyncio.gather(*(innocent(count + n) for n in range(count)))


def assert_refused(response_status: int, headers, body: bytes, reason: str) -> None:
    assert response_status == 502
    error = json.loads(body)["error"]
    assert error["code"] == "UPSTREAM_RESET"
    assert error["details"]["reason"] == reason
    assert error["details"]["source"] == "sidecar"
    assert headers["X-Sidecar-Outcome"] == "not-retryable"
    assert headers["X-Sidecar-Trail"] == "malformed"
    assert headers["x-should-retry"] == "false"


MALFORMED = [
    (
        "space-before-colon",
        b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello",
        "whitespace before a header's colon",
    ),
    (
        "gzip-then-chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "transfer coding 'gzip, chunked' is not a lone chunked",
    ),
    (
        "chunked-then-gzip",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "transfer coding 'chunked, gzip' is not a lone chunked",
    ),
    (
        "chunked-twice",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        "transfer coding 'chunked, chunked' is not a lone chunked",
    ),
    (
        "te-and-cl",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        "both Transfer-Encoding and Content-Length",
    ),
    (
        "conflicting-cl",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "conflicting Content-Length values",
    ),
    (
        "cl-list",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
        "conflicting Content-Length values",
    ),
    (
        "cl-not-a-number",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        "Content-Length is not a number",
    ),
    (
        "ctl-01-value",
        b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 5\r\n\r\nhello",
        "a control byte in a header value",
    ),
    (
        "ctl-1b-value",
        b"HTTP/1.1 200 OK\r\nX-A: a\x1bb\r\nContent-Length: 5\r\n\r\nhello",
        "a control byte in a header value",
    ),
    (
        "ctl-7f-value",
        b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 5\r\n\r\nhello",
        "a control byte in a header value",
    ),
    (
        "ctl-reason",
        b"HTTP/1.1 200 O\x01K\r\nContent-Length: 5\r\n\r\nhello",
        "a control byte in the reason phrase",
    ),
    (
        "latin-1-header",
        b"HTTP/1.1 200 OK\r\nX-Foo: caf\xe9\r\nContent-Length: 5\r\n\r\nhello",
        "header X-Foo is not valid UTF-8",
    ),
    (
        "unsolicited-101",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "an unsolicited 101 Switching Protocols",
    ),
    (
        "obs-fold",
        b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 5\r\n\r\nhello",
        "a folded header line (obs-fold)",
    ),
    (
        "bare-lf",
        b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
        "a line of the head does not end in CRLF",
    ),
    (
        "http2-status-line",
        b"HTTP/2.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        "the status line is malformed",
    ),
    (
        "te-in-http10",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "Transfer-Encoding in an HTTP/1.0 answer",
    ),
    (
        "chunk-size-not-hex",
        b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"\r\nzz\r\n{}\r\n0\r\n\r\n",
        "a chunk's size line is malformed",
    ),
    (
        "chunk-longer-than-its-size",
        b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n2\r\n{}}\r\n0\r\n\r\n",
        "a chunk's data is longer than its size",
    ),
    (
        "chunk-size-with-trailing-spaces",
        b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n2  \r\n{}\r\n0\r\n\r\n",
        "a chunk's size line is malformed",
    ),
    (
        "chunk-size-with-a-bare-semicolon",
        b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n2;\r\n{}\r\n0\r\n\r\n",
        "a chunk's size line is malformed",
    ),
    (
        "head-over-the-limit",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 5\r\n\r\nhello",
        "the answer's head is over 65536 bytes",
    ),
]


@pytest.mark.parametrize(
    ("reply", "reason"),
    [(reply, reason) for _, reply, reason in MALFORMED],
    ids=[name for name, _, _ in MALFORMED],
)
async def test_a_malformed_answer_is_refused_once_and_poisons_nothing(make_sidecar, reply, reason):
    tool = HostileTool([reply])
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url, upstream_max_connections=1)
        async with sidecar.client.get("/hostile") as response:
            assert_refused(response.status, response.headers, await response.read(), reason)
        await assert_innocents_get_their_own(sidecar)

    assert tool.paths.count(b"/hostile") == 1  # never retried: the tool ran the call
    assert tool.connections[0] == [b"/hostile"]  # and its connection carried nothing more
    counted = {"route": "default", "method": "GET", "outcome": "not-retryable"}
    assert sidecar.registry.get_sample_value("sidecar_requests_total", counted) == 1


# Heads a tool starts and never ends, holding its connection: each is refused at its first
# bad line, not when the per-try timeout runs out.
HELD_HEADS = [
    (
        "obs-fold-after-the-status-line",
        b"HTTP/1.1 200 OK\r\n X-A: b\r\n",
        "a folded header line (obs-fold)",
    ),
    ("status-line", b"HTTP/1.1 20 OK\r\nX-A: b\r\n", "the status line is malformed"),
    ("no-colon", b"HTTP/1.1 200 OK\r\nX-A b\r\n", "a header line has no colon"),
]


@pytest.mark.parametrize(
    ("head", "reason"), [held[1:] for held in HELD_HEADS], ids=[held[0] for held in HELD_HEADS]
)
async def test_a_bad_line_of_a_head_that_never_ends_is_refused_at_once(make_sidecar, head, reason):
    tool = HostileTool([head])
    async with raw_tool(tool.handle) as url:
        # A refusal only at the head's end would be a 504 after this timeout.
        sidecar = await make_sidecar(
            url, upstream_max_connections=1, per_try_timeout_ms=60_000, request_timeout_ms=60_000
        )
        async with sidecar.client.get("/hostile") as response:
            assert_refused(response.status, response.headers, await response.read(), reason)
        await assert_innocents_get_their_own(sidecar)
    assert tool.paths.count(b"/hostile") == 1


TRAILING = [
    (
        "smuggled-head-after-a-length",
        "GET",
        [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + SMUGGLED],
        (200, b"hello"),
    ),
    (
        "smuggled-head-after-204",
        "GET",
        [b"HTTP/1.1 204 No Content\r\n\r\n" + SMUGGLED],
        (204, b""),
    ),
    (
        "smuggled-head-after-a-chunked-body",
        "GET",
        [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            b"\r\n2\r\n{}\r\n0\r\n\r\n" + SMUGGLED
        ],
        (200, b"{}"),
    ),
    (
        "a-body-after-head",
        "HEAD",
        [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        (200, b""),
    ),
    (
        "a-body-after-304",
        "GET",
        [b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\nhello'],
        (304, b""),
    ),
    (
        "junk-after-the-body",
        "GET",
        [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello\x00\x01junk"],
        (200, b"hello"),
    ),
    (
        "junk-in-a-later-write",
        "GET",
        [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", SMUGGLED + b"x\r\n\r\n"],
        (200, b"hello"),
    ),
]


@pytest.mark.parametrize(
    ("method", "pieces", "expected"),
    [(method, pieces, expected) for _, method, pieces, expected in TRAILING],
    ids=[name for name, _, _, _ in TRAILING],
)
async def test_an_answer_with_bytes_after_it_is_relayed_once_and_its_connection_closed(
    make_sidecar, method, pieces, expected
):
    tool = HostileTool(pieces)
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url, upstream_max_connections=1)
        async with sidecar.client.request(method, "/hostile") as response:
            assert (response.status, await response.read()) == expected
            assert response.headers["X-Sidecar-Outcome"] == "ok"
            assert "X-Smuggled" not in response.headers
        await assert_innocents_get_their_own(sidecar)

    assert tool.paths.count(b"/hostile") == 1
    assert tool.connections[0] == [b"/hostile"]


async def test_a_clean_answer_keeps_its_connection_for_the_next_request(make_sidecar):
    """The control case: without stray bytes, the connection is reused (so the tests above,
    which see it closed, can tell the difference)."""
    tool = HostileTool([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"])
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url, upstream_max_connections=1)
        async with sidecar.client.get("/hostile") as response:
            assert await response.read() == b"hello"
        await assert_innocents_get_their_own(sidecar, count=2)

    assert tool.connections[0][:2] == [b"/hostile", b"/innocent/0"]


async def test_two_hundred_agents_beside_a_smuggling_tool_each_get_their_own_answer(
    make_sidecar,
):
    """The field report: one connection, 20 smuggling answers among 180 innocent calls."""
    tool = HostileTool([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + SMUGGLED])
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url, upstream_max_connections=1)

        async def call(n: int) -> tuple[str, int, bytes, str | None]:
            path = "/hostile" if n % 10 == 0 else f"/innocent/{n}"
            async with sidecar.client.get(path) as response:
                return (
                    path,
                    response.status,
                    await response.read(),
                    response.headers.get("X-Answer-For"),
                )

        results = await asyncio.gather(*(call(n) for n in range(200)))

    altered = [
        result
        for result in results
        if result[0] != "/hostile" and (result[1], result[3]) != (200, result[0])
    ]
    assert altered == []
    assert all(result[1:3] == (200, b"hello") for result in results if result[0] == "/hostile")
    assert all(
        carried.count(b"/hostile") <= 1
        and (b"/hostile" not in carried or carried[-1] == b"/hostile")
        for carried in tool.connections
    )


async def test_the_tool_cannot_forge_the_sidecars_report(make_sidecar):
    tool = HostileTool(
        [
            b"HTTP/1.1 200 OK\r\nX-Sidecar-Repaired: llm\r\nX-Sidecar-Outcome: recovered\r\n"
            b"X-Sidecar-Made-Up: 1\r\nContent-Length: 2\r\n\r\nok"
        ]
    )
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url)
        async with sidecar.client.get("/hostile") as response:
            assert await response.read() == b"ok"
            sidecar_headers = {
                name: value
                for name, value in response.headers.items()
                if name.lower().startswith("x-sidecar-")
            }

    assert sidecar_headers == {
        "X-Sidecar-Attempts": "1",
        "X-Sidecar-Outcome": "ok",
        "X-Sidecar-Trail": "200",
    }


async def test_a_relayed_answer_carries_only_what_the_tool_sent_and_the_report(make_sidecar):
    """No ``Server``, no default ``Content-Type``; ``Date`` only because the tool sent none
    (RFC 9110 §6.6.1 asks a proxy to add it)."""
    reply = (
        b"HTTP/1.1 200 Fine\r\nX-One: 1\r\nx-two: two\r\nX-One: 3\r\nContent-Length: 3\r\n\r\nabc"
    )
    tool = HostileTool([reply])
    async with raw_tool(tool.handle) as url:
        sidecar = await make_sidecar(url)
        answer = await raw_exchange(
            sidecar.client.port,
            b"GET /hostile HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            until_closed=True,
        )

    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    names = [line.split(b":", 1)[0].lower() for line in lines]
    assert status_line == b"HTTP/1.1 200 Fine"
    assert body == b"abc"
    assert [line for line in lines if line.lower().startswith(b"x-")][:3] == [
        b"X-One: 1",
        b"x-two: two",
        b"X-One: 3",
    ]
    assert sorted(set(names)) == sorted(
        {
            b"x-one",
            b"x-two",
            b"content-length",
            b"x-sidecar-attempts",
            b"x-sidecar-outcome",
            b"x-sidecar-trail",
            b"date",
            b"connection",
        }
    )


# Generated answers: h11, a strict HTTP/1.1 implementation nobody here wrote, is the judge
# of what a valid answer is and what it holds.

_header_names = st.sampled_from([b"X-A", b"x-b", b"ETag", b"Cache-Control", b"X-Trace-Id"])
_header_values = st.binary(min_size=0, max_size=12).map(
    lambda raw: bytes(byte for byte in raw if 0x21 <= byte <= 0x7E)
)
_bodies = st.binary(max_size=300)
_statuses = st.sampled_from([200, 201, 202, 203, 400, 404, 409, 422])
# Ways to break an answer that RFC 9112 and h11 agree on.
_BREAKS = {
    "none": lambda head: head,
    "space-before-colon": lambda head: head.replace(b"X-A:", b"X-A :", 1),
    "second-length": lambda head: head.replace(
        b"\r\n\r\n", b"\r\nContent-Length: 99999\r\n\r\n", 1
    ),
    "gzip-coding": lambda head: head.replace(
        b"\r\n\r\n", b"\r\nTransfer-Encoding: gzip\r\n\r\n", 1
    ),
}


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, bytes, str]:
    """An answer's bytes, what follows them, and how (if at all) the answer is broken."""
    status = draw(_statuses)
    extra = draw(st.lists(st.tuples(_header_names, _header_values), max_size=4))
    headers = [(b"X-A", b"1"), *extra]
    body = draw(_bodies)
    chunked = draw(st.booleans())
    head = b"HTTP/1.1 %d Whatever\r\n" % status
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    if chunked:
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        sizes = draw(st.lists(st.integers(1, 64), max_size=6))
        framed, rest = b"", body
        for size in sizes:
            if rest:
                framed += b"%x\r\n%s\r\n" % (len(rest[:size]), rest[:size])
                rest = rest[size:]
        if rest:
            framed += b"%x\r\n%s\r\n" % (len(rest), rest)
        framed += b"0\r\n\r\n"
    else:
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        framed = body
    broken = draw(st.sampled_from(sorted(_BREAKS)))
    if chunked and broken == "second-length":
        # TE with CL: h11 reads it by TE, the sidecar refuses it (a test above says so).
        broken = "gzip-coding"
    trailing = draw(st.sampled_from([b"", SMUGGLED, b"\r\n", b"garbage"]))
    return _BREAKS[broken](head) + framed, trailing, broken


def h11_reading(answer: bytes) -> tuple[int, bytes] | None:
    """Status and body as h11 reads ``answer`` to a GET, or None when h11 refuses it."""
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method="GET", target="/", headers=[("Host", "tool")]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(answer)
    status, body = 0, b""
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, body
            else:
                return None
    except h11.RemoteProtocolError:
        return None


@pytest.fixture
async def hostile(make_sidecar):
    """One hostile tool and one sidecar for every generated answer: what one example's
    answer leaves behind must not reach the next example's requests either."""
    tool = HostileTool([])
    async with raw_tool(tool.handle) as url:
        yield tool, await make_sidecar(url, upstream_max_connections=1, max_retries=0)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=answers(), split=st.integers(min_value=0, max_value=400))
async def test_generated_answers_are_relayed_as_h11_reads_them_or_refused(hostile, answer, split):
    tool, sidecar = hostile
    answer_bytes, trailing, broken = answer
    reading = h11_reading(answer_bytes)
    assert (reading is None) == (broken != "none")  # the generator breaks what it says
    tool.pieces = [answer_bytes[:split], answer_bytes[split:] + trailing]
    path = f"/hostile/{len(tool.paths)}"
    async with sidecar.client.get(path) as response:
        got = (response.status, await response.read())
    if reading is None:
        assert got[0] == 502
        assert json.loads(got[1])["error"]["code"] == "UPSTREAM_RESET"
    else:
        assert got == reading
    await assert_innocents_get_their_own(sidecar, count=2)

    assert tool.paths.count(path.encode()) == 1
    if trailing or reading is None:
        carrier = next(carried for carried in tool.connections if path.encode() in carried)
        assert carrier[-1] == path.encode()
