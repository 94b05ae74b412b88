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

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class EventScanner:
    """The data of each event of a stream fed to it chunk by chunk, in order."""

    __slots__ = ("_after_cr", "_data", "_first_line", "_partial")

    def __init__(self) -> None:
        self._partial = bytearray()  # the line begun in an earlier chunk
        self._data: list[bytes] = []  # the data lines of the event being read
        self._after_cr = False  # the last chunk ended in CR: a first LF belongs to it
        self._first_line = True

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that ended within ``chunk``."""
        events: list[bytes] = []
        if not chunk:
            return events
        start = 1 if self._after_cr and chunk[:1] == b"\n" else 0
        self._after_cr = False
        for end in _LINE_END.finditer(chunk, start):
            piece = chunk[start : end.start()]
            if self._partial:
                self._partial += piece
                piece = bytes(self._partial)
                self._partial.clear()
            self._line(piece, events)
            start = end.end()
            self._after_cr = start == len(chunk) and end.group() == b"\r"
        self._partial += chunk[start:]
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            if self._data:  # an event without a data field is not dispatched
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line[:1] == b":":
            return  # a comment
        name, _, value = line.partition(b":")
        if name == b"data":
            self._data.append(value[1:] if value[:1] == b" " else value)


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
    """The event that answers a call, looked for in the first ``limit`` bytes of its stream."""

    __slots__ = ("_left", "_rpc_id", "_scanner")

    def __init__(self, rpc_id: bytes | None, limit: int) -> None:
        self._scanner = EventScanner()
        self._rpc_id = rpc_id
        self._left = limit

    @property
    def exhausted(self) -> bool:
        """Whether ``limit`` bytes were read without the answer among them."""
        return self._left <= 0

    def feed(self, chunk: bytes) -> bytes | None:
        """The next bytes of the stream; the answer's data once an event in them holds it."""
        piece = chunk if len(chunk) <= self._left else chunk[: self._left]
        self._left -= len(piece)
        for data in self._scanner.feed(piece):
            if answers_call(data, self._rpc_id):
                return data
        return None
