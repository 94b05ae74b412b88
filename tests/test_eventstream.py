"""The event-stream reader, without sockets: which event answers a call, however the stream
is spelled and cut into chunks (tables in h11's manner)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.tool.eventstream import (
    LINE_KEPT,
    AnswerReader,
    EventScanner,
    answers_call,
    rpc_id_text,
)

ANSWER = b'{"jsonrpc":"2.0","id":3,"result":{"content":[],"isError":true}}'
ID_3 = rpc_id_text(3)


def scanned(*chunks: bytes) -> list[bytes]:
    scanner = EventScanner()
    return [data for chunk in chunks for data in scanner.feed(chunk)]


def answer_in(stream: bytes, rpc_id: bytes | None = ID_3, limit: int = 65536) -> bytes | None:
    """The answer a reader finds in ``stream`` fed whole."""
    return AnswerReader(rpc_id, limit).feed(stream)


@pytest.mark.parametrize(
    ("stream", "events"),
    [
        # the MCP SDK's priming event, then its answer (sse-starlette writes CRLF)
        (b"id: 1\r\ndata: \r\n\r\nid: 2\r\nevent: message\r\ndata: x\r\n\r\n", [b"", b"x"]),
        (b"data: a\n\ndata: b\n\n", [b"a", b"b"]),  # LF
        (b"data: a\r\rdata: b\r\r", [b"a", b"b"]),  # CR
        (b"data: a\r\n\ndata: b\n\r\n", [b"a", b"b"]),  # mixed
        (b"data: one\ndata:two\ndata:  three\n\n", [b"one\ntwo\n three"]),  # several lines
        (b"data\n\n", [b""]),  # a field name alone: an empty value
        (b": ping\n\n: ping\r\n\r\ndata: x\n\n", [b"x"]),  # comments are not events
        (b"id: 7\nevent: message\nretry: 10\n\n", []),  # no data field: nothing dispatched
        (b"data: x\n", []),  # not ended by a blank line
        (b"data: x", []),  # not even by a line end
        (b"\xef\xbb\xbfdata: x\n\n", [b"x"]),  # a leading BOM is dropped
        (b"data: x\n\n\xef\xbb\xbfdata: y\n\n", [b"x"]),  # ... only at the start
        (b"Data: x\n\n", []),  # field names are case-sensitive
        (b"data : x\n\n", []),  # "data " is another field
        (b"\n\n\ndata: x\n\n", [b"x"]),  # blank lines without data dispatch nothing
    ],
    ids=lambda value: repr(value)[:40],
)
def test_events_of_a_stream(stream, events):
    assert scanned(stream) == events


@pytest.mark.parametrize(
    "stream",
    [
        b"id: 1\r\ndata: \r\n\r\nid: 2\r\nevent: message\r\ndata: x\r\n\r\n",
        b"data: a\r\rdata: b\r\r",
        b"data: a\r\n\r\ndata: b\r\n\r\n",
        b": ping\r\n\r\ndata: one\r\ndata: two\r\n\r\n",
    ],
)
def test_every_split_of_a_stream_gives_the_same_events(stream):
    """A CRLF cut between its CR and its LF, a line or a field name cut anywhere."""
    whole = scanned(stream)
    for cut in range(len(stream) + 1):
        assert scanned(stream[:cut], stream[cut:]) == whole, cut
    assert scanned(*(stream[i : i + 1] for i in range(len(stream)))) == whole


@given(st.lists(st.sampled_from([b"data: x", b"data:y", b": c", b"id: 1", b""]), max_size=12))
def test_any_line_ends_give_the_same_events(lines):
    """LF, CR and CRLF are one line end to the reader, and an empty chunk changes nothing."""
    as_lf = scanned(b"".join(line + b"\n" for line in lines))
    assert scanned(b"".join(line + b"\r" for line in lines)) == as_lf
    assert scanned(b"", *(line + b"\r\n" for line in lines), b"") == as_lf


def rpc(message: dict[str, object]) -> bytes:
    return b"event: message\r\ndata: " + orjson.dumps({"jsonrpc": "2.0", **message}) + b"\r\n\r\n"


PRIMING = b"id: 1\r\ndata: \r\n\r\n"
PROGRESS = rpc({"method": "notifications/progress", "params": {"progressToken": 1}})
SAMPLING = rpc({"id": 3, "method": "sampling/createMessage", "params": {}})  # the server's own
RESULT = orjson.dumps({"jsonrpc": "2.0", "id": 3, "result": {}})
SPLIT = b'{"jsonrpc":"2.0","id":3,\n"error":{"code":-1}}'


@pytest.mark.parametrize(
    ("stream", "answer"),
    [
        (PRIMING + b"id: 2\r\nevent: message\r\ndata: " + ANSWER + b"\r\n\r\n", ANSWER),
        (b": ping\n\n" + PRIMING + PROGRESS + SAMPLING + rpc({"id": 3, "result": {}}), RESULT),
        (PROGRESS + b"data: " + ANSWER + b"\n\n", ANSWER),
        (b'data: {"jsonrpc":"2.0","id":3,\ndata: "error":{"code":-1}}\n\n', SPLIT),
        (rpc({"id": "3", "result": {}}), None),  # another id: "3" is not 3
        (rpc({"id": 4, "result": {}}), None),
        (rpc({"id": 3}), None),  # neither a result nor an error
        (b'data: {"id":3,"result":{}}\n\n', None),  # not JSON-RPC 2.0
        (b"data: [" + ANSWER + b"]\n\n", None),  # a batch is not the answer
        (b'data: {"jsonrpc":"2.0","id":3,"result":\n\n', None),  # broken JSON
        (PRIMING + b"data: " + ANSWER, None),  # the answer's event has not ended
    ],
    ids=[
        "priming-then-answer",
        "comments-notifications-and-requests-first",
        "notification-first",
        "data-over-two-lines",
        "string-id",
        "other-id",
        "no-result",
        "not-jsonrpc",
        "batch",
        "broken-json",
        "unended",
    ],
)
def test_the_answer_to_request_3(stream, answer):
    assert answer_in(stream) == answer


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, b"3"), ("3", b'"3"'), (None, b"null"), (1.5, b"1.5"), (True, None), ([3], None)],
)
def test_rpc_ids_are_compared_as_written(value, text):
    assert rpc_id_text(value) == text


def test_a_call_that_is_not_json_rpc_is_answered_by_its_first_data():
    """An OpenAI-style stream: the first event with data decides, as before; a priming event
    (empty data) does not."""
    stream = PRIMING + b'data: {"id":"chatcmpl-1","choices":[]}\n\ndata: [DONE]\n\n'
    assert answer_in(stream, rpc_id=None) == b'{"id":"chatcmpl-1","choices":[]}'
    assert not answers_call(b"", None)


@pytest.mark.parametrize("limit", [len(PRIMING) + 10, len(PRIMING + rpc({"id": 3})) - 1])
def test_an_answer_past_the_limit_is_not_read(limit):
    stream = PRIMING + rpc({"id": 3, "result": {}})
    reader = AnswerReader(ID_3, limit)
    assert [reader.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)] == [None] * len(
        range(0, len(stream), 7)
    )
    assert reader.exhausted


def test_an_answer_ending_at_the_limit_is_read():
    stream = PRIMING + rpc({"id": 3, "result": {}})
    reader = AnswerReader(ID_3, len(stream))
    assert reader.feed(stream) is not None
    assert reader.exhausted


def test_a_stream_fed_byte_by_byte_is_answered_at_the_answer_s_last_line_end():
    """Hundreds of notifications before the answer, one byte per chunk: the answer is taken
    at the CR that ends its blank line (a CR alone ends a line; the LF after it belongs to
    it), no earlier, and none is missed."""
    stream = PROGRESS * 300 + rpc({"id": 3, "result": {}})
    reader = AnswerReader(ID_3, len(stream))
    found = [reader.feed(stream[i : i + 1]) for i in range(len(stream))]
    assert found[-2] == RESULT
    assert found[:-2] + found[-1:] == [None] * (len(stream) - 1)


# --- what resuming a stream needs: the last id, where the last event ended, liveness -------

PRIMED = b"id: s1-1\r\ndata: \r\n\r\n"
PROGRESS = rpc({"method": "notifications/progress", "params": {"progress": 1}})


@pytest.mark.parametrize(
    ("stream", "last_event_id", "boundary", "events"),
    [
        (b"", None, 0, 0),
        (PRIMED, b"s1-1", len(PRIMED), 1),  # the priming event: an id, no data
        (PRIMED + b"id: s1-2\r\ndata: {}", b"s1-1", len(PRIMED), 1),  # an event under way
        (PRIMED + b"id: s1-2\r\ndata: {}\r\n\r\n", b"s1-2", len(PRIMED) + 22, 2),
        (b": ping\n\n", None, 8, 1),  # a comment shows the server is there
        (b"id: 7\n\ndata: x\n\n", b"7", 16, 2),  # an id stays the stream's until changed
        (b"id: 7\n\nid\n\n", None, 11, 2),  # an empty id resets it: nothing to resume from
        (b"id: 7\n\nid: a\0b\n\n", b"7", 16, 2),  # an id holding NUL is ignored
        (b"\n\n\n", None, 3, 0),  # blank lines end no event
        (b"id: 9\r", None, 0, 0),  # a line ended, the event not
    ],
    ids=lambda value: repr(value)[:40],
)
def test_where_the_last_whole_event_ended_and_its_id(stream, last_event_id, boundary, events):
    for cut in range(len(stream) + 1):
        scanner = EventScanner(keep_data=False)
        scanner.feed(stream[:cut])
        scanner.feed(stream[cut:])
        assert (scanner.last_event_id, scanner.boundary, scanner.events) == (
            last_event_id,
            boundary,
            events,
        ), cut


def test_a_notification_before_the_answer_shows_the_call_alive_and_a_priming_event_does_not():
    primed = AnswerReader(ID_3, 65536)
    assert primed.feed(PRIMED + b": ping\r\n\r\n") is None
    assert not primed.alive
    assert primed.feed(PROGRESS) is None
    assert primed.alive
    assert primed.feed(rpc({"id": 3, "result": {}})) is not None


def test_past_its_limit_a_reader_still_follows_ids_and_boundaries_but_keeps_no_data():
    reader = AnswerReader(ID_3, len(PRIMED))
    assert reader.feed(PRIMED + b"id: s1-2\r\ndata: " + b"x" * 1000 + b"\r\n\r\n") is None
    assert reader.exhausted
    assert reader.scanner.last_event_id == b"s1-2"
    assert reader.feed(rpc({"id": 3, "result": {}})) is None  # not looked for past the limit
    assert reader.scanner.at_boundary


def test_a_relayed_streams_long_lines_cost_no_memory_and_a_long_id_resumes_nothing():
    """A stream only followed (the relay's) keeps ``LINE_KEPT`` bytes of a line at most:
    a 1 MiB data line is read past, and an id too long to keep leaves no id to resume from."""
    relayed = AnswerReader(None, 0)
    relayed.feed(b"id: s1-1\n\ndata: " + b"x" * 2**20)
    assert len(relayed.scanner._partial) <= LINE_KEPT  # the line still arriving
    relayed.feed(b"\n\n")
    assert relayed.scanner.last_event_id == b"s1-1"  # an id line of its own is kept
    relayed.feed(b"id: " + b"9" * (LINE_KEPT + 1) + b"\n\n")
    assert relayed.scanner.last_event_id is None
    assert relayed.scanner.at_boundary


@pytest.mark.parametrize(
    ("stream", "last_event_id"),
    [
        (b"id: " + b"9" * (LINE_KEPT + 76) + b"\n\n", None),  # an id cut short is none
        (b"data: " + b"x" * 2 * LINE_KEPT + b"\nid: 7\n\n", b"7"),  # the next line is whole
        (b"id: 5\n\ndata: " + b"x" * 2 * LINE_KEPT + b"\n\nid: 6\n\n", b"6"),
    ],
    ids=["long id", "id after a long line", "id after a long event"],
)
def test_a_relayed_streams_cut_line_is_judged_wherever_the_chunks_split_it(stream, last_event_id):
    """A line longer than ``LINE_KEPT`` split across chunks is cut, and only it: at every
    split point an id cut short resumes nothing and the line after a cut one is read whole."""
    for split in range(0, len(stream), 7):
        scanner = EventScanner(keep_data=False)
        scanner.feed(stream[:split])
        scanner.feed(stream[split:])
        assert scanner.last_event_id == last_event_id, split
