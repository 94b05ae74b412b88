"""The one body stream both sides read: what "at the end" means, how it ends short, and the
backpressure it asks of its connection. No sockets: a recording connection under it."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.wire.body import BodyStream, read_deadline

HIGH_WATER = 8


class Connection:
    """Records what the body asks of the connection under it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def pause_reading(self) -> None:
        self.asked.append("pause")

    def resume_reading(self) -> None:
        self.asked.append("resume")


def body() -> tuple[BodyStream, Connection]:
    connection = Connection()
    return BodyStream(connection, HIGH_WATER), connection


async def test_arrived_and_read_are_two_ends() -> None:
    stream, _ = body()
    stream.feed(b"ab")
    stream.feed_eof()
    assert (stream.is_eof(), stream.at_eof()) == (True, False)
    assert await stream.readany() == b"ab"
    assert (stream.is_eof(), stream.at_eof()) == (True, True)
    assert await stream.readany() == b""


async def test_an_exception_after_the_whole_body_arrived_cuts_nothing() -> None:
    stream, _ = body()
    stream.feed(b"ab")
    stream.feed_eof()
    stream.set_exception(ConnectionResetError())
    assert [await stream.readany(), await stream.readany()] == [b"ab", b""]


async def test_an_exception_before_the_end_comes_after_what_arrived() -> None:
    stream, _ = body()
    stream.feed(b"ab")
    stream.set_exception(ConnectionResetError())
    assert await stream.readany() == b"ab"
    with pytest.raises(ConnectionResetError):
        await stream.readany()


async def test_a_body_abandoned_loses_what_was_buffered_even_once_arrived() -> None:
    stream, _ = body()
    stream.feed(b"ab")
    stream.feed_eof()
    stream.abandon(ConnectionResetError())
    # Never an empty read that passes for the end of a body that was cut.
    with pytest.raises(ConnectionResetError):
        await stream.readany()


@pytest.mark.parametrize(
    ("fed", "reads"),
    [
        ((b"abc",), [b"abc"]),
        ((b"ab", b"cd"), [b"abcd"]),  # what waits is read at once
        ((b"abcde", b"fghij"), [b"abcde", b"fghij"]),  # past the mark, a chunk at a time
    ],
)
async def test_what_readany_gives(fed: tuple[bytes, ...], reads: list[bytes]) -> None:
    stream, _ = body()
    for chunk in fed:
        stream.feed(chunk)
    stream.feed_eof()
    assert [await stream.readany() for _ in reads] == reads


async def test_reading_pauses_past_the_mark_and_resumes_at_half_of_it() -> None:
    stream, connection = body()
    stream.feed(b"12345")
    stream.feed(b"6789")  # 9 unread: past the mark of 8
    assert connection.asked == ["pause"]
    assert await stream.readany() == b"12345"  # 4 left: half the mark
    assert connection.asked == ["pause", "resume"]


async def test_readexactly_waits_past_the_mark_without_pausing_its_connection() -> None:
    stream, connection = body()
    reading = asyncio.ensure_future(stream.readexactly(12))
    await asyncio.sleep(0)
    for chunk in (b"12345", b"67890", b"ab"):
        stream.feed(chunk)
        await asyncio.sleep(0)
    assert await reading == b"1234567890ab"
    assert "pause" not in connection.asked
    # The mark is back where it was: past it, reading pauses again.
    stream.feed(b"cdefghijk")
    assert connection.asked[-1] == "pause"


async def test_readexactly_of_a_body_that_ends_short() -> None:
    stream, _ = body()
    stream.feed(b"abc")
    stream.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError) as short:
        await stream.readexactly(5)
    assert (short.value.partial, short.value.expected) == (b"abc", 5)
    assert stream.at_eof()


async def test_no_timer_for_a_body_that_has_all_arrived() -> None:
    stream, _ = body()
    assert isinstance(read_deadline(stream, 1.0), asyncio.Timeout)
    stream.feed(b"ab")
    stream.feed_eof()
    # Unread yet, but all here: reading it cannot wait.
    assert not isinstance(read_deadline(stream, 1.0), asyncio.Timeout)
