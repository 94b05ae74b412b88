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


# Every refusal reason the parser gives, on a short answer (the head limit is 128 bytes here).
SMALL_LIMIT = 128
REFUSALS = [
    (
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 120 + b"\r\n\r\n",
        "the answer's head is over 128 bytes",
    ),
    (
        b"HTTP/1.1 200 OK\r\nX-A: a\nContent-Length: 0\r\n\r\n",
        "a line of the head does not end in CRLF",
    ),
    (b"HTTP/1.1 200 OK\nX-A: a\r\n\r\n", "a line of the head does not end in CRLF"),
    (b"HTTP/1.1 200 OK\nX-A: a\n\n", "a line of the head does not end in CRLF"),
    (b"HTTP/1.1 200 OK\r\nX-A: a\r\r\n\r\n", "a control byte in a header value"),
    (b"HTTP/1.1 20 OK\r\n\r\n", "the status line is malformed"),
    (b"HTTP/1.2 200 OK\r\n\r\n", "the status line is malformed"),
    (b"HTTP/1.1 200\tOK\r\n\r\n", "the status line is malformed"),
    (b"HTTP/1.1 600 Nope\r\n\r\n", "status 600 out of range"),
    (b"HTTP/1.1 200 O\x00K\r\n\r\n", "a control byte in the reason phrase"),
    (b"HTTP/1.1 200 caf\xe9\r\n\r\n", "reason phrase is not valid UTF-8"),
    (b"HTTP/1.1 200 OK\r\n\tX-A: a\r\n\r\n", "a folded header line (obs-fold)"),
    (b"HTTP/1.1 200 OK\r\nX-A a\r\n\r\n", "a header line has no colon"),
    (b"HTTP/1.1 200 OK\r\nX-A : a\r\n\r\n", "whitespace before a header's colon"),
    (b"HTTP/1.1 200 OK\r\n: a\r\n\r\n", "whitespace before a header's colon"),
    (b"HTTP/1.1 200 OK\r\nX(A): a\r\n\r\n", "a header name is not a token"),
    (b"HTTP/1.1 200 OK\r\nX-A: \x7f\r\n\r\n", "a control byte in a header value"),
    (b"HTTP/1.1 200 OK\r\nX-A: caf\xe9\r\n\r\n", "header X-A is not valid UTF-8"),
    (b"HTTP/1.1 101 Switching\r\n\r\n", "an unsolicited 101 Switching Protocols"),
    (
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "both Transfer-Encoding and Content-Length",
    ),
    (
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        "Transfer-Encoding in an HTTP/1.0 answer",
    ),
    (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        "transfer coding 'gzip' is not a lone chunked",
    ),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0x1\r\n\r\n", "Content-Length is not a number"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n", "conflicting Content-Length values"),
]
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNK_REFUSALS = [
    b"zz\r\n",
    b"2  \r\n{}\r\n0\r\n\r\n",  # whitespace after the size
    b"2 \r\n{}\r\n0\r\n\r\n",
    b"2;\r\n{}\r\n0\r\n\r\n",  # a bare ";"
    b"2; \r\n{}\r\n0\r\n\r\n",
    b"2;a=\r\n{}\r\n0\r\n\r\n",  # "=" without a value
    b'2;a="b\r\n{}\r\n0\r\n\r\n',  # an unclosed quoted-string
    b"2;a b\r\n{}\r\n0\r\n\r\n",
    b"12345678901234567\r\n",  # more than 16 hex digits
    b"2\n{}\r\n0\r\n\r\n",
    b"-2\r\n{}\r\n0\r\n\r\n",
    b"0x2\r\n{}\r\n0\r\n\r\n",
    b" 2\r\n{}\r\n0\r\n\r\n",
]
CHUNK_DATA_REFUSALS = [b"2\r\n{}}\r\n0\r\n\r\n", b"2\r\n{}\n0\r\n\r\n", b"2\r\n{}\r0\r\n\r\n"]
TRAILER_REFUSALS = [
    b"0\r\nX-T : t\r\n\r\n",
    b"0\r\n t\r\n\r\n",
    b"0\r\nX-T: t\n\r\n",
    b"0\r\nX-T t\r\n\r\n",
]
EVERY_REFUSAL = (
    REFUSALS
    + [(CHUNKED + tail, "a chunk's size line is malformed") for tail in CHUNK_REFUSALS]
    + [(CHUNKED + tail, "a chunk's data is longer than its size") for tail in CHUNK_DATA_REFUSALS]
    + [(CHUNKED + tail, "the answer's trailer section is malformed") for tail in TRAILER_REFUSALS]
)
# Chunk lines RFC 9112 §7.1.1 allows: whitespace around an extension's ";" and "=".
ACCEPTED_CHUNK_LINES = [
    b"2",
    b"2;a",
    b"2 ;a",
    b"2; a",
    b"2;a=b",
    b"2 ; a = b",
    b'2;a="b c"',
    b'2;a="\\""',
    b"2;a;b=c",
    b"0002",
    b"2\t;a",
]


def refusal_at_split(data: bytes, at: int, max_head: int = SMALL_LIMIT) -> str | None:
    """The refusal of ``data`` fed in two reads, split at ``at``."""
    parser = AnswerParser(Events(), "GET", max_head)
    try:
        parser.feed(data[:at])
        parser.feed(data[at:])
        parser.feed_eof()
    except MalformedAnswer as refused:
        return str(refused)
    return None


@pytest.mark.parametrize(("answer", "reason"), EVERY_REFUSAL, ids=lambda value: "")
def test_every_refusal_reason_at_every_split_point(answer, reason):
    assert [refusal_at_split(answer, at) for at in range(len(answer) + 1)] == [reason] * (
        len(answer) + 1
    )


@pytest.mark.parametrize("line", ACCEPTED_CHUNK_LINES)
def test_a_chunk_line_the_grammar_allows_is_read_at_every_split_point(line):
    answer = CHUNKED + line + b"\r\n{}\r\n0\r\n\r\n"
    for at in range(len(answer) + 1):
        events = Events()
        parser = AnswerParser(events, "GET", MAX_HEAD)
        parser.feed(answer[:at])
        parser.feed(answer[at:])
        assert parser.done
        assert events.seen[1:] == [b"{}", "end"]


# A head that never ends, as a tool holding its connection sends it: the first bad line is
# refused when its bytes are in, whichever read brings them.
HELD = [
    (b"HTTP/1.1 200 OK\r\n X-A: b\r\n", "a folded header line (obs-fold)"),
    (b"HTTP/1.1 200 OK\r\nX-A: a\r\n\tb\r\n", "a folded header line (obs-fold)"),
    (b"HTTP/1.1 2000 OK\r\n", "the status line is malformed"),
    (b"HTTP/1.1 999 OK\r\n", "status 999 out of range"),
    (b"HTTP/1.1 200 OK\r\nX-A b\r\n", "a header line has no colon"),
    (b"HTTP/1.1 200 OK\r\nX-A : b\r\n", "whitespace before a header's colon"),
    (b"HTTP/1.1 200 OK\r\nX-A: \x01\r\n", "a control byte in a header value"),
]


@pytest.mark.parametrize(("head", "reason"), HELD, ids=lambda value: "")
def test_a_bad_line_is_refused_before_the_head_ends(head, reason):
    for size in (1, 3, len(head)):
        parser = AnswerParser(Events(), "GET", MAX_HEAD)
        with pytest.raises(MalformedAnswer) as refused:
            for piece in pieces(head, size):
                parser.feed(piece)
        assert str(refused.value) == reason


def test_a_good_head_still_coming_is_held_without_a_refusal():
    events = Events()
    parser = AnswerParser(events, "GET", MAX_HEAD)
    for piece in pieces(b"HTTP/1.1 200 OK\r\nX-A: b\r\nX-B: c", 1):
        parser.feed(piece)
    assert events.seen == []
