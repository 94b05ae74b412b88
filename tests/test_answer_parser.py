"""The tool-answer parser fed in pieces, without sockets: the same events and the same
refusal however the bytes are split, at a cost linear in the bytes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sidecar.transport.answer import AnswerParser, Head, MalformedAnswer
from tests.test_wire_conformance import MALFORMED

MAX_HEAD = 64 * 1024
# A head inside the default limit, in 1,000 header lines.
BIG_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-Field-%04d: %s\r\n" % (n, b"v" * 40) for n in range(1000))
    + b"Content-Length: 2\r\n\r\n{}"
)
SMALL_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

WELL_FORMED = [
    SMALL_HEAD,
    BIG_HEAD,
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
    b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\njunk",
    b"HTTP/1.0 200 OK\r\n\r\nuntil the end",
]


class Events:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def answer_head(self, head: Head) -> None:
        self.seen.append((head.status, head.reason, list(head.headers.items()), head.framing))

    def answer_body(self, chunk: bytes) -> None:
        assert type(chunk) is bytes
        if self.seen and isinstance(self.seen[-1], bytes):
            self.seen[-1] += chunk
        else:
            self.seen.append(chunk)

    def answer_end(self) -> None:
        self.seen.append("end")


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    return (data[at : at + size] for at in range(0, len(data), size))


def parse(data: bytes, size: int) -> tuple[list[object], str | None, bool]:
    """The events, refusal (if any) and ``trailing`` of ``data`` fed ``size`` bytes at a time."""
    events = Events()
    parser = AnswerParser(events, "GET", MAX_HEAD)
    try:
        for piece in pieces(data, size):
            parser.feed(piece)
        parser.feed_eof()
    except MalformedAnswer as refused:
        return events.seen, str(refused), parser.trailing
    return events.seen, None, parser.trailing


@pytest.mark.parametrize(
    "answer", [reply for _, reply, _ in MALFORMED] + WELL_FORMED, ids=lambda _: ""
)
def test_the_same_answer_parses_the_same_however_it_is_split(answer):
    whole = parse(answer, len(answer))
    assert parse(answer, 4) == whole
    assert parse(answer, 1) == whole


@pytest.mark.parametrize(("name", "answer", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_each_refusal_keeps_its_reason_in_single_bytes(name, answer, reason):
    assert parse(answer, 1)[1] == reason


def cpu_of(heads: list[bytes], size: int) -> float:
    """The least CPU of three runs parsing each of ``heads`` fed ``size`` bytes at a time."""
    best = float("inf")
    for _ in range(3):
        split = [list(pieces(head, size)) for head in heads]
        started = time.process_time()
        for head_pieces in split:
            parser = AnswerParser(Events(), "GET", MAX_HEAD)
            for piece in head_pieces:
                parser.feed(piece)
        best = min(best, time.process_time() - started)
    return best


def test_a_large_head_in_single_bytes_costs_what_as_many_reads_of_small_heads_cost():
    # Re-scanning the whole buffer on every read made this ratio about 75 (4.5 s against
    # 60 ms); scanning each byte once makes it about 1. The bound leaves room for a loaded
    # machine without letting a quadratic parser through.
    small_heads = [SMALL_HEAD] * (len(BIG_HEAD) // len(SMALL_HEAD))
    ratio = cpu_of([BIG_HEAD], 1) / cpu_of(small_heads, 1)
    assert ratio < 5
