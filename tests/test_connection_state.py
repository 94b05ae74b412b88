"""The tool connection's state and the pool's reuse rule, without sockets.

The transitions are a table (as h11 tests its state machine); the reuse rule is driven
through the real ``Pool`` and ``Connection`` over a scripted byte stream of this test's
own (as httpcore tests its connection on a mock stream): the tool's answer comes in the
pieces given, and the number of streams the pool opened tells whether it reused one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from multidict import CIMultiDict
from yarl import URL

from sidecar.bugs import SidecarBug
from sidecar.transport.answer import MalformedAnswer
from sidecar.transport.connection import (
    TRANSITIONS,
    Connection,
    ConnectionBroken,
    ConnectionEvent,
    ConnectionState,
    PoolKey,
    Progress,
    RequestBody,
    next_state,
)
from sidecar.transport.pool import Pool
from tests.conftest import hang

IDLE, ACTIVE, MUST_CLOSE, CLOSED = ConnectionState  # in the order they are defined
E = ConnectionEvent

STEPS = [
    (IDLE, E.SEND, ACTIVE),
    (IDLE, E.OUT_OF_STEP, MUST_CLOSE),  # bytes nobody asked for
    (IDLE, E.CLOSED, CLOSED),
    (ACTIVE, E.ANSWER_WHOLE, IDLE),
    (ACTIVE, E.CLOSE_ASKED, MUST_CLOSE),
    (ACTIVE, E.OUT_OF_STEP, MUST_CLOSE),
    (ACTIVE, E.CLOSED, CLOSED),
    (MUST_CLOSE, E.ANSWER_WHOLE, MUST_CLOSE),  # a whole answer does not undo a close
    (MUST_CLOSE, E.CLOSE_ASKED, MUST_CLOSE),
    (MUST_CLOSE, E.OUT_OF_STEP, MUST_CLOSE),
    (MUST_CLOSE, E.CLOSED, CLOSED),
    (CLOSED, E.ANSWER_WHOLE, CLOSED),
    (CLOSED, E.CLOSE_ASKED, CLOSED),
    (CLOSED, E.OUT_OF_STEP, CLOSED),
    (CLOSED, E.CLOSED, CLOSED),
]
REFUSED_STEPS = [
    (ACTIVE, E.SEND),  # one request at a time
    (MUST_CLOSE, E.SEND),
    (CLOSED, E.SEND),
    (IDLE, E.ANSWER_WHOLE),  # no request, no answer
    (IDLE, E.CLOSE_ASKED),
]


@pytest.mark.parametrize(("state", "event", "after"), STEPS)
def test_each_step_of_a_connection(state, event, after):
    assert next_state(state, event) is after


@pytest.mark.parametrize(("state", "event"), REFUSED_STEPS)
def test_a_step_that_cannot_happen_is_the_sidecars_bug_not_the_tools_reset(state, event):
    with pytest.raises(SidecarBug) as raised:
        next_state(state, event)
    # Not what ``exchange`` turns into the tool's reset, which the machine would retry.
    assert not isinstance(raised.value, ConnectionBroken | OSError)


def test_the_tables_cover_every_pair_once():
    pairs = {(state, event) for state, event, _ in STEPS} | set(REFUSED_STEPS)
    assert len(pairs) == len(STEPS) + len(REFUSED_STEPS) == len(ConnectionState) * len(E)
    assert set(TRANSITIONS) == {(state, event) for state, event, _ in STEPS}


def test_only_an_idle_connection_can_carry_a_request():
    reaches_active = [state for state in ConnectionState if (state, E.SEND) in TRANSITIONS]
    assert reaches_active == [IDLE]


class ScriptedStream:
    """A byte stream under one ``Connection``: it records what the connection wrote and,
    once a request's head is whole, hands the connection the tool's answer ``pieces``."""

    def __init__(self, connection: Connection, pieces: list[bytes]) -> None:
        self.connection = connection
        self.pieces = pieces
        self.written = bytearray()
        self.closing = False
        self.answered = 0

    def write(self, data: bytes) -> None:
        self.written += data
        requests = self.written.count(b"\r\n\r\n")
        if requests > self.answered:
            self.answered = requests
            for piece in self.pieces:
                asyncio.get_running_loop().call_soon(self._deliver, piece)

    def writelines(self, lines: list[bytes]) -> None:
        self.write(b"".join(lines))

    def _deliver(self, piece: bytes) -> None:
        if not self.closing:
            self.connection.data_received(piece)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.connection.connection_lost, None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class ScriptedPool:
    """The real pool, opening scripted streams instead of sockets."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.streams: list[ScriptedStream] = []
        self.pool = Pool(limit=1, max_head_bytes=64 * 1024, opener=self._open)

    async def _open(self, pool: Pool, key: PoolKey) -> Connection:
        connection = Connection(key, pool.max_head_bytes, pool.forget)
        stream = ScriptedStream(connection, self.pieces)
        self.streams.append(stream)
        connection.connection_made(stream)  # type: ignore[arg-type]  # a stream of our own
        return connection


async def ask(pool: Pool, method: str = "GET", body: RequestBody = b"") -> bytes | str:
    """One request through ``pool``: its answer's body, or the refusal's reason."""
    try:
        response = await pool.request(
            method, URL("http://tool.test/call"), CIMultiDict(), body, Progress(), 5.0
        )
    except (MalformedAnswer, ConnectionBroken) as refused:
        return str(refused)
    received = bytearray()
    try:
        while chunk := await response.content.readany():
            received += chunk
    except (MalformedAnswer, ConnectionBroken) as refused:
        return str(refused)
    response.release()
    return bytes(received)


async def held_back() -> AsyncIterator[bytes]:
    """A streamed request body whose end the tool's answer overtakes."""
    yield b"{}"
    await hang()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
# (name, the tool's answer in pieces, method, request body, streams opened for two requests)
REUSE = [
    ("a-length-answer", [OK], "GET", b"", 1),
    ("a-length-answer-in-bytes", [OK[:20], OK[20:40], OK[40:]], "GET", b"", 1),
    (
        "a-chunked-answer",
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"],
        "GET",
        b"",
        1,
    ),
    ("a-204", [b"HTTP/1.1 204 No Content\r\n\r\n"], "GET", b"", 1),
    (
        "a-head-answer-with-a-length",
        [b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"],
        "HEAD",
        b"",
        1,
    ),
    ("an-interim-then-the-answer", [b"HTTP/1.1 100 Continue\r\n\r\n", OK], "POST", b"{}", 1),
    (
        "connection-close",
        [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"],
        "GET",
        b"",
        2,
    ),
    ("http-1.0", [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"], "GET", b"", 2),
    ("bytes-after-the-answer", [OK + b"HTTP/1.1 200 OK\r\n"], "GET", b"", 2),
    ("bytes-after-the-answer-in-a-later-read", [OK, b"X"], "GET", b"", 2),
    ("a-body-after-204", [b"HTTP/1.1 204 No Content\r\n\r\n{}"], "GET", b"", 2),
    ("a-malformed-answer", [b"HTTP/1.1 200 OK\r\n X: folded\r\n"], "GET", b"", 2),
    ("an-answer-before-the-request-body-ends", [OK], "POST", None, 2),
]


@pytest.mark.parametrize(
    ("pieces", "method", "body", "opened"),
    [case[1:] for case in REUSE],
    ids=[case[0] for case in REUSE],
)
async def test_the_pool_reuses_a_connection_only_when_its_state_is_idle(
    pieces, method, body, opened
):
    scripted = ScriptedPool(pieces)
    for _ in range(2):
        await ask(scripted.pool, method, held_back() if body is None else body)
    assert len(scripted.streams) == opened
    await scripted.pool.close()


async def test_bytes_while_idle_close_the_connection_before_it_is_offered_again():
    scripted = ScriptedPool([OK])
    assert await ask(scripted.pool) == b"{}"
    (stream,) = scripted.streams
    stream.connection.data_received(b"HTTP/1.1 200 OK\r\n")  # unasked for
    assert stream.connection.state is CLOSED
    assert await ask(scripted.pool) == b"{}"
    assert len(scripted.streams) == 2


async def test_the_states_one_request_goes_through():
    connection = Connection((False, "tool.test", 80), 64 * 1024, lambda _: None)
    stream = ScriptedStream(connection, [])  # the test hands the answer in itself
    connection.connection_made(stream)  # type: ignore[arg-type]
    seen = [connection.state]
    deadline = asyncio.get_running_loop().time() + 5
    sending = asyncio.ensure_future(
        connection.exchange("GET", b"GET / HTTP/1.1\r\n\r\n", b"", False, Progress(), deadline)
    )
    await asyncio.sleep(0)  # the request goes out; the answer is awaited
    seen.append(connection.state)
    connection.data_received(OK[:-2])
    head, body = await sending
    assert head.status == 200
    seen.append(connection.state)  # the head came, the body has not
    connection.data_received(OK[-2:])
    seen.append(connection.state)
    assert await body.readany() == b"{}"
    connection.data_received(b"H")  # after the answer: out of step
    seen.append(connection.state)
    assert seen == [IDLE, ACTIVE, ACTIVE, IDLE, CLOSED]
