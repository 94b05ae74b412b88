"""The grammar of an answer's head and chunk lines (RFC 9112, RFC 9110 §5.5), and the
words a refusal uses to say which rule a line broke (the 502's ``details.reason``)."""

from __future__ import annotations

import re

TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# Field lines (RFC 9110 §5.5): a token, the colon right after it, then tabs, spaces, visible
# characters and obs-text up to CRLF. Whitespace before the colon, obs-fold, a bare CR or
# LF and control bytes all fail to match.
FIELD_LINES = re.compile(rb"(?:" + TOKEN + rb":[\t\x20-\x7e\x80-\xff]*\r\n)*")
STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: ([\t\x20-\x7e\x80-\xff]*))?\r\n")
# chunk-size [ chunk-ext ] CRLF (RFC 9112 §7.1.1): whitespace only around an extension's
# ";" and "=", each extension a token name with an optional token or quoted-string value.
# A size with trailing spaces ("25  ") or a bare ";" is refused, as llhttp's strict mode
# refuses them. Extensions are read past, never used.
QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
CHUNK_EXT = rb"[\t ]*;[\t ]*" + TOKEN + rb"(?:[\t ]*=[\t ]*(?:" + TOKEN + rb"|" + QUOTED + rb"))?"
CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:" + CHUNK_EXT + rb")*\r\n")
MAX_CHUNK_LINE = 4096
BARE_LF = "a line of the head does not end in CRLF"
CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def has_bare_lf(buffer: bytes | bytearray, start: int) -> bool:
    """Whether an LF at or after ``start`` lacks its CR (the byte before is always in)."""
    found = buffer.find(b"\n", start)
    while found >= 0:
        if found == 0 or buffer[found - 1] != 0x0D:
            return True
        found = buffer.find(b"\n", found + 1)
    return False


def undecodable(block: bytes) -> str:
    """Which header's bytes are not UTF-8."""
    for line in block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return f"header {name.decode('ascii')} is not valid UTF-8"
    raise AssertionError("a block that does not decode has a line that does not")


def status_line_fault(line: bytes) -> str:
    """Which rule a status line breaks, for the 502's ``details.reason``."""
    if b"\n" in line:
        return BARE_LF  # as a read that ends at the LF finds it
    loose = re.match(rb"HTTP/1\.[01] ([0-9]{3})(?: |$)", line)
    if loose is not None and not 100 <= int(loose[1]) <= 599:
        return f"status {int(loose[1])} out of range"
    if loose is not None and CONTROL.search(line):
        return "a control byte in the reason phrase"
    return "the status line is malformed"


def field_fault(block: bytes) -> str:
    """Which rule a field block breaks, for the 502's ``details.reason``."""
    for line in block.split(b"\r\n")[:-1]:
        if b"\n" in line:
            return BARE_LF  # as a read that ends at the LF finds it
        if line[:1] in (b" ", b"\t"):
            return "a folded header line (obs-fold)"
        name, colon, value = line.partition(b":")
        if not colon:
            return "a header line has no colon"
        if not name or name != name.strip(b" \t"):
            return "whitespace before a header's colon"
        if re.fullmatch(TOKEN, name) is None:
            return "a header name is not a token"
        if CONTROL.search(value):
            return "a control byte in a header value"
    return BARE_LF
