"""Where an event stream may end: after a whole event, never inside one. Pure.

An event stream (``text/event-stream``, the HTML standard's server-sent events) is lines
ended by CRLF, LF or CR; a blank line ends an event (a comment line is an event as far as
framing goes). A stream cut after a blank line is whole to its reader: it dispatched every
event it got, and an MCP client reconnects with ``Last-Event-ID``. One cut anywhere else
loses, or worse, half-delivers, the event being read.
"""

from __future__ import annotations

import re

EVENT_STREAM = "text/event-stream"

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_TERMINATORS = b"\r\n"


class EventBoundary:
    """Follows the bytes of an event stream as they are relayed: ``at_boundary`` holds
    when they end after a whole event (or before the first)."""

    def __init__(self) -> None:
        self.at_boundary = True
        # The line breaks since the last byte of content (at most the last three bytes:
        # two breaks, one of them CRLF, decide it).
        self._breaks = b""
        self._started = False

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        content = chunk.rstrip(_TERMINATORS)
        if content:
            self._started = True
            self._breaks = chunk[len(content) :]
        else:
            self._breaks = (self._breaks + chunk)[-3:]
        breaks = len(_LINE_BREAK.findall(self._breaks))
        self.at_boundary = not self._started or breaks >= 2


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names an event stream (parameters aside)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == EVENT_STREAM
