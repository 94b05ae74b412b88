"""A tool's answer read strictly (RFC 9112), one parser per answer.

A proxy that frames an answer by a header the agent reads differently, or that keeps the
bytes a tool wrote past the end of its answer, lets one tool's bytes become another
request's answer. So this reader guesses at nothing:

- the head must be exactly what RFC 9112 allows: ``HTTP/1.x``, a status from 100 to 599,
  CRLF line ends, a token right before each colon, no control bytes in a value or the
  reason, UTF-8 throughout (the agent-facing writer could not pass other bytes on as
  they came);
- the body's framing must be unambiguous: a lone ``chunked`` transfer coding with no
  ``Content-Length``, or one ``Content-Length`` (repeats must agree), or neither (the body
  runs to the connection's end); an unsolicited ``101`` is refused;
- anything else raises ``MalformedAnswer``, and the caller closes the connection.

Bytes after the answer's end (a second head, a body after ``HEAD``/``204``/``304``, junk)
are not parsed: ``trailing`` says they came, and the connection must not carry another
request.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.wire.grammar import (
    BARE_LF,
    CHUNK_LINE,
    FIELD_LINES,
    MAX_CHUNK_LINE,
    STATUS_LINE,
    field_fault,
    has_bare_lf,
    status_line_fault,
    undecodable,
)


class MalformedAnswer(Exception):
    """The tool's bytes are not one unambiguous HTTP/1.1 answer; ``str()`` says why."""


class Framing(enum.Enum):
    NONE = "none"  # no body: HEAD, 1xx, 204, 304
    LENGTH = "length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until_close"


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    framing: Framing
    length: int | None  # with ``Framing.LENGTH``
    keep_alive: bool  # HTTP/1.1 without ``Connection: close``


class AnswerSink(Protocol):
    """Where the parser puts what it read."""

    def answer_head(self, head: Head) -> None: ...
    def answer_body(self, chunk: bytes) -> None: ...
    def answer_end(self) -> None: ...


class _State(enum.Enum):
    HEAD = "head"
    LENGTH = "length"
    CHUNK_SIZE = "chunk_size"
    CHUNK_DATA = "chunk_data"
    CHUNK_END = "chunk_end"  # the CRLF after a chunk's data
    TRAILERS = "trailers"
    UNTIL_CLOSE = "until_close"
    DONE = "done"


class AnswerParser:
    """Reads one answer to a ``method`` request, fed as bytes arrive."""

    __slots__ = (
        "_checked",
        "_head_only",
        "_held",
        "_max_head",
        "_remaining",
        "_scanned",
        "_sink",
        "_state",
        "trailing",
    )

    def __init__(self, sink: AnswerSink, method: str, max_head_bytes: int) -> None:
        self._sink = sink
        self._head_only = method == "HEAD"
        self._max_head = max_head_bytes
        # The start of a line or head not yet whole, and how much of it was searched: each
        # byte is looked at a bounded number of times however finely the answer is split
        # (as h11's receive buffer does). Re-scanning the whole buffer on every read cost a
        # 58 KB head 4.5 s of CPU in 1-byte writes, against 3 ms whole.
        self._held = bytearray()
        self._scanned = 0
        # Where the first head line not yet checked starts: a head still coming is checked
        # line by line, so a tool that sends a bad line and holds its connection is refused
        # at once rather than when its per-try timeout runs out.
        self._checked = 0
        self._state = _State.HEAD
        self._remaining = 0
        self.trailing = False  # bytes came after the answer's end

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises ``MalformedAnswer`` at the first byte that cannot be."""
        if self._state is _State.DONE:
            self.trailing = self.trailing or bool(data)
            return
        buffer: bytes | bytearray = data
        if self._held:
            self._held += data
            buffer, self._held = self._held, bytearray()
        while buffer:
            state = self._state
            if state is _State.HEAD:
                buffer = self._read_head(buffer)
            elif state is _State.LENGTH or state is _State.CHUNK_DATA:
                buffer = self._read_counted(bytes(buffer))  # bytes already: no copy
            elif state is _State.CHUNK_SIZE:
                buffer = self._read_chunk_size(buffer)
            elif state is _State.CHUNK_END:
                buffer = self._read_chunk_end(buffer)
            elif state is _State.TRAILERS:
                buffer = self._read_trailers(buffer)
            elif state is _State.UNTIL_CLOSE:
                self._sink.answer_body(bytes(buffer))
                return
            else:
                return  # done: ``_finish`` saw what follows
            if self._held:  # waiting for more bytes to finish a line
                return

    def _hold(self, buffer: bytes | bytearray) -> bytes:
        """Keep ``buffer`` (searched to its end) until more bytes come."""
        self._held = buffer if isinstance(buffer, bytearray) else bytearray(buffer)
        self._scanned = len(buffer)
        return b""

    def _resume_at(self, overlap: int) -> int:
        """Where the search for a delimiter ``overlap + 1`` bytes long resumes."""
        scanned, self._scanned = self._scanned, 0
        return max(0, scanned - overlap)

    def feed_eof(self) -> bool:
        """The connection ended; whether the answer is whole (a body that runs until the
        connection's end ends here)."""
        if self._state is _State.UNTIL_CLOSE:
            self._finish(b"")
        return self._state is _State.DONE

    def _finish(self, rest: bytes) -> bytes:
        """The answer ended; ``rest`` is what followed it in the same read. ``trailing`` is
        set before the sink hears of the end, so whoever takes the connection back then
        already knows it must not be reused."""
        self._state = _State.DONE
        self.trailing = bool(rest)
        self._sink.answer_end()
        return rest

    def _read_head(self, buffer: bytes | bytearray) -> bytes:
        searched = self._scanned
        end = buffer.find(b"\r\n\r\n", self._resume_at(3))
        if end < 0:
            if len(buffer) > self._max_head:
                raise MalformedAnswer(f"the answer's head is over {self._max_head} bytes")
            self._checked = _check_lines(buffer, self._checked, searched)
            if has_bare_lf(buffer, searched):
                raise MalformedAnswer(BARE_LF)
            return self._hold(buffer)
        checked, self._checked = self._checked, 0
        if end + 4 > self._max_head:
            raise MalformedAnswer(f"the answer's head is over {self._max_head} bytes")
        # Copies held bytes only; the lines checked as they came are not checked again.
        head = _parse_head(bytes(buffer), end + 2, self._head_only, checked)
        rest = _rest(buffer, end + 4)
        if 100 <= head.status < 200:
            return rest  # an interim answer (100, 103): the final one follows
        self._sink.answer_head(head)
        if head.framing is Framing.NONE or head.length == 0:
            return self._finish(rest)
        if head.framing is Framing.LENGTH:
            assert head.length is not None
            self._remaining = head.length
            self._state = _State.LENGTH
        elif head.framing is Framing.CHUNKED:
            self._state = _State.CHUNK_SIZE
        else:
            self._state = _State.UNTIL_CLOSE
        return rest

    def _read_counted(self, buffer: bytes) -> bytes:
        """Body bytes of a known count: the whole answer's, or one chunk's."""
        take = self._remaining
        if len(buffer) < take:
            self._remaining -= len(buffer)
            self._sink.answer_body(buffer)
            return b""
        if take:
            self._sink.answer_body(buffer[:take] if len(buffer) > take else buffer)
        self._remaining = 0
        if self._state is _State.LENGTH:
            return self._finish(buffer[take:])
        self._state = _State.CHUNK_END
        return buffer[take:]

    def _read_chunk_size(self, buffer: bytes | bytearray) -> bytes:
        searched = self._scanned
        end = buffer.find(b"\r\n", self._resume_at(1))
        if end < 0:
            if len(buffer) > MAX_CHUNK_LINE or buffer.find(b"\n", searched) >= 0:
                raise MalformedAnswer("a chunk's size line is malformed")
            return self._hold(buffer)
        match = CHUNK_LINE.fullmatch(buffer, 0, end + 2)
        if match is None:
            raise MalformedAnswer("a chunk's size line is malformed")
        size = int(match[1], 16)
        if size:
            self._remaining = size
            self._state = _State.CHUNK_DATA
        else:
            self._state = _State.TRAILERS
        return _rest(buffer, end + 2)

    def _read_chunk_end(self, buffer: bytes | bytearray) -> bytes:
        self._scanned = 0
        if len(buffer) < 2:
            if buffer != b"\r":
                raise MalformedAnswer("a chunk's data is longer than its size")
            return self._hold(buffer)
        if not buffer.startswith(b"\r\n"):
            raise MalformedAnswer("a chunk's data is longer than its size")
        self._state = _State.CHUNK_SIZE
        return _rest(buffer, 2)

    def _read_trailers(self, buffer: bytes | bytearray) -> bytes:
        """The trailer section after the last chunk: checked like the head, then dropped
        (the agent-facing side has no way to send trailers on)."""
        searched = self._scanned
        if buffer.startswith(b"\r\n"):
            self._scanned = 0
            return self._finish(_rest(buffer, 2))
        end = buffer.find(b"\r\n\r\n", self._resume_at(3))
        if end < 0:
            if len(buffer) > self._max_head or has_bare_lf(buffer, searched):
                raise MalformedAnswer("the answer's trailer section is malformed")
            return self._hold(buffer)
        if FIELD_LINES.fullmatch(buffer, 0, end + 2) is None:
            raise MalformedAnswer("the answer's trailer section is malformed")
        return self._finish(_rest(buffer, end + 4))


def _rest(buffer: bytes | bytearray, start: int) -> bytes:
    """What follows ``start``, as bytes for the sink."""
    return bytes(buffer[start:]) if isinstance(buffer, bytearray) else buffer[start:]


def _check_lines(buffer: bytes | bytearray, start: int, searched: int) -> int:
    """Checks the whole lines of a head still coming, from ``start`` (a line's start), the
    status line first, in one match per read; the search for line ends resumes where the
    last one stopped. Returns where the next line to check starts."""
    end = buffer.rfind(b"\r\n", max(start, searched - 1))
    if end < 0:
        return start
    if start == 0:
        status_end = buffer.find(b"\r\n") + 2
        if STATUS_LINE.fullmatch(buffer, 0, status_end) is None:
            raise MalformedAnswer(status_line_fault(bytes(buffer[: status_end - 2])))
        start = status_end
    if start < end + 2 and FIELD_LINES.fullmatch(buffer, start, end + 2) is None:
        raise MalformedAnswer(field_fault(bytes(buffer[start : end + 2])))
    return end + 2


def _parse_head(buffer: bytes, fields_end: int, head_only: bool, checked: int) -> Head:
    """The head in ``buffer[:fields_end]`` (its last CRLF included), checked."""
    status_line = STATUS_LINE.match(buffer, 0, fields_end)
    if status_line is None:
        raise MalformedAnswer(status_line_fault(buffer[: buffer.find(b"\r\n")]))
    fields_start = max(status_line.end(), checked)
    if FIELD_LINES.fullmatch(buffer, fields_start, fields_end) is None:
        raise MalformedAnswer(field_fault(buffer[status_line.end() : fields_end]))
    try:
        reason = (status_line[3] or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedAnswer("reason phrase is not valid UTF-8") from None
    headers: CIMultiDict[str] = CIMultiDict()
    # An answer without fields ends its status line where its fields would end: the block
    # is empty. The bound keeps the slice's end from falling before its start, which the
    # compiled build's bytes slice turns into an error instead of an empty slice.
    fields_from = status_line.end()
    block = buffer[fields_from : max(fields_from, fields_end - 2)]
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedAnswer(undecodable(block)) from None
    if text:
        for line in text.split("\r\n"):
            name, _, value = line.partition(":")
            headers.add(name, value.strip(" \t"))
    status = int(status_line[2])
    http10 = status_line[1] == b"0"
    if status == 101:
        raise MalformedAnswer("an unsolicited 101 Switching Protocols")
    framing, length = _framing(headers, status, head_only, http10)
    keep_alive = not http10 and (
        "Connection" not in headers or "close" not in _tokens(headers.getall("Connection"))
    )
    return Head(status, reason, CIMultiDictProxy(headers), framing, length, keep_alive)


def _framing(
    headers: CIMultiDict[str], status: int, head_only: bool, http10: bool
) -> tuple[Framing, int | None]:
    """How the body is delimited (RFC 9112 §6.3), refusing every ambiguous case."""
    if head_only or status < 200 or status in (204, 304):
        return Framing.NONE, None
    codings = _tokens(headers.getall("Transfer-Encoding")) if "Transfer-Encoding" in headers else []
    lengths = headers.getall("Content-Length", ())
    if len(lengths) == 1 and lengths[0].isdigit() and lengths[0].isascii() and not codings:
        return Framing.LENGTH, int(lengths[0])  # the usual case, said once
    lengths = _tokens(lengths)
    if codings:
        if lengths:
            raise MalformedAnswer("both Transfer-Encoding and Content-Length")
        if http10:
            raise MalformedAnswer("Transfer-Encoding in an HTTP/1.0 answer")
        if codings != ["chunked"]:
            raise MalformedAnswer(f"transfer coding {', '.join(codings)!r} is not a lone chunked")
        return Framing.CHUNKED, None
    if lengths:
        if not all(value.isdigit() and value.isascii() for value in lengths):
            raise MalformedAnswer("Content-Length is not a number")
        if len({int(value) for value in lengths}) > 1:
            raise MalformedAnswer("conflicting Content-Length values")
        return Framing.LENGTH, int(lengths[0])
    return Framing.UNTIL_CLOSE, None


def _tokens(values: Iterable[str]) -> list[str]:
    """The comma-separated elements of a list-valued field, lower-cased, empties dropped."""
    return [token for value in values for raw in value.split(",") if (token := raw.strip().lower())]
