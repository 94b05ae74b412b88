"""A ``text/event-stream`` body read as it arrives, up to the event that answers the call.

An MCP server that keeps its streams resumable opens every POST's stream with a priming
event (an ``id`` and an empty ``data``; MCP 2025-11-25, "Resumability"), may send comments
(``: ping``) and its own notifications and requests, and then the response to the call. The
scanner follows the WHATWG rules for the format (HTML §9.2.6): lines end in CRLF, LF or CR,
a blank line ends an event, ``data`` lines join with LF, a leading BOM is dropped, and an
event cut off by the end of the stream is no event. It keeps no more than the line it is in
and the data of the event it is in: each byte is looked at once by the line search and
copied a bounded number of times, however the stream is cut into chunks.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from sidecar.tool.json_value import parse_json

EVENT_STREAM = "text/event-stream"
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


# What a stream only followed keeps of one line: enough for any ``id`` a server numbers its
# events with, and a line's kind.
LINE_KEPT = 1024


class EventScanner:
    """The data of each event of a stream fed to it chunk by chunk, in order; and what
    resuming or ending the stream needs.

    ``last_event_id`` is the id the stream's reader holds after the last event that ended
    (what an MCP client sends back as ``Last-Event-ID``: the HTML standard's last event ID,
    set at every event's end, data or not; ``None`` while it is empty); ``boundary`` is
    where in the stream that event ended (the bytes before it are whole events); ``events``
    counts the events that ended, comments and priming events included: each shows the
    server is there. With ``keep_data`` false the data of events is not kept (a stream only
    relayed), nor more than ``LINE_KEPT`` bytes of a line: a relayed stream's lines cost no
    memory however long they are, and an ``id`` longer than that leaves the stream with no
    id to resume from. ``fed`` counts the bytes fed.
    """

    __slots__ = (
        "_after_cr",
        "_cut",
        "_data",
        "_first_line",
        "_id",
        "_in_event",
        "_partial",
        "boundary",
        "events",
        "fed",
        "keep_data",
        "last_event_id",
    )

    def __init__(self, *, keep_data: bool = True) -> None:
        self._partial = bytearray()  # the line begun in an earlier chunk
        self._cut = False  # ... and cut at ``LINE_KEPT``, its data not kept
        self._data: list[bytes] = []  # the data lines of the event being read
        self._after_cr = False  # the last chunk ended in CR: a first LF belongs to it
        self._first_line = True
        self._in_event = False  # a line of an event not yet ended was read
        self._id: bytes | None = None  # the last event ID buffer
        self.fed = 0
        self.keep_data = keep_data
        self.last_event_id: bytes | None = None
        self.boundary = 0
        self.events = 0

    @property
    def at_boundary(self) -> bool:
        """Whether the bytes fed so far end after a whole event (or before the first): a
        stream cut here loses nothing to its reader."""
        return self.boundary == self.fed or (not self._in_event and not self._partial)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that ended within ``chunk``."""
        events: list[bytes] = []
        if not chunk:
            return events
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = (
                1  # the LF of a CRLF the last chunk cut: an event that ended there ends after it
            )
            if self.boundary == self.fed:
                self.boundary += 1
        self._after_cr = False
        for end in _LINE_END.finditer(chunk, start):
            piece = chunk[start : end.start()]
            if self._partial:
                self._keep(piece)  # may cut the line: read ``_cut`` after it
                piece = bytes(self._partial)
                self._partial.clear()
            cut, self._cut = self._cut, False
            start = end.end()
            self._line(piece, events, self.fed + start, cut)
            self._after_cr = start == len(chunk) and end.group() == b"\r"
        self._keep(chunk[start:])
        self.fed += len(chunk)
        return events

    def _keep(self, part: bytes) -> None:
        """``part`` of the line being read, kept whole only while data is kept."""
        if self.keep_data:
            self._partial += part
            return
        room = LINE_KEPT - len(self._partial)
        if len(part) > room:
            self._cut = True
            part = part[: max(room, 0)]
        self._partial += part

    def _line(self, line: bytes, events: list[bytes], ends_at: int, cut: bool = False) -> None:
        cut = cut or (not self.keep_data and len(line) > LINE_KEPT)
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            if self._in_event:
                self.events += 1
                # An empty buffer is no id: a reader sends no Last-Event-ID for it.
                self.last_event_id = self._id or None
                self._in_event = False
            self.boundary = ends_at
            if self._data:  # an event without a data field is not dispatched
                events.append(b"\n".join(self._data))
                self._data = []
            return
        self._in_event = True
        if line[:1] == b":":
            return  # a comment
        name, _, value = line.partition(b":")
        value = value[1:] if value[:1] == b" " else value
        if name == b"data" and self.keep_data:
            self._data.append(value)
        elif name == b"id" and cut:
            self._id = None  # an id cut short is none the stream can be resumed from
        elif name == b"id" and b"\0" not in value:
            self._id = value


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names an event stream (parameters aside)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == EVENT_STREAM


def rpc_id_text(value: Any) -> bytes | None:
    """A JSON-RPC id as JSON text, compared as written (``1`` is not ``"1"``); ``None`` for a
    value JSON-RPC does not allow as an id."""
    if value is None or isinstance(value, str | float) or type(value) is int:
        return orjson.dumps(value)
    return None


def answers_call(data: bytes, rpc_id: bytes | None) -> bool:
    """Whether an event's ``data`` answers the call: for a JSON-RPC request (``rpc_id``, its
    id as JSON text), its response — a ``result`` or an ``error`` under the same id; for any
    other call, the first data there is. Notifications and requests of the server's own, and
    events without data (a priming event), answer nothing."""
    if rpc_id is None:
        return bool(data)
    if b'"jsonrpc"' not in data:
        return False
    document = parse_json(data)
    return (
        isinstance(document, dict)
        and document.get("jsonrpc") == "2.0"
        and "method" not in document
        and ("result" in document or "error" in document)
        and "id" in document
        and rpc_id_text(document["id"]) == rpc_id
    )


class AnswerReader:
    """The event that answers a call, looked for in the first ``limit`` bytes of its stream.

    Past ``limit`` the stream is still followed (its ids, boundaries and events), its data
    no longer kept. ``alive`` says an event other than the answer came with data (a
    notification, a request to the client): the call is running, and its stream is worth
    passing on as it comes."""

    __slots__ = ("_left", "_rpc_id", "alive", "scanner")

    def __init__(self, rpc_id: bytes | None, limit: int) -> None:
        self.scanner = EventScanner(keep_data=limit > 0)
        self._rpc_id = rpc_id
        self._left = limit
        self.alive = False

    @property
    def exhausted(self) -> bool:
        """Whether ``limit`` bytes were read without the answer among them."""
        return self._left <= 0

    def feed(self, chunk: bytes) -> bytes | None:
        """The next bytes of the stream; the answer's data once an event in them holds it."""
        if self._left <= 0:
            self.scanner.feed(chunk)
            return None
        piece = chunk if len(chunk) <= self._left else chunk[: self._left]
        self._left -= len(piece)
        for data in self.scanner.feed(piece):
            if answers_call(data, self._rpc_id):
                return data
            if data:
                self.alive = True
        if self._left <= 0:
            self.scanner.keep_data = False
            self.scanner.feed(chunk[len(piece) :])
        return None
