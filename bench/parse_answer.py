"""The cost of reading one tool answer: the sidecar's strict parser beside the parsers it
could have used instead, on the same bytes, in one process.

- ``sidecar``: ``sidecar.transport.answer.AnswerParser``, a new parser per answer.
- ``aiohttp``: aiohttp's C (llhttp) ``HttpResponseParser``, one kept per connection as 0.3
  did; it is not public API (``aiohttp.http_parser``) and needs a protocol object.
- ``httptools``: llhttp's public binding (uvicorn's), a new parser per answer, headers
  gathered by callback; ``pip install httptools`` to include it.

    python bench/parse_answer.py
"""

from __future__ import annotations

import asyncio
import timeit
from collections.abc import Callable

from multidict import CIMultiDict

from sidecar.transport.answer import AnswerParser, Head

BODY = b'{"success": true, "data": {"temp_c": 21}}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: %d\r\nDate: Wed, 25 Nov 2026 14:30:30 GMT\r\n"
    b"Server: Python/3.11 aiohttp/3.14.5\r\nX-Request-ID: 0123456789abcdef0123456789abcdef\r\n"
    b"\r\n%s" % (len(BODY), BODY)
)
RUNS = 100_000


class _Sink:
    __slots__ = ("body", "head")

    def __init__(self) -> None:
        self.head: Head | None = None
        self.body: list[bytes] = []

    def answer_head(self, head: Head) -> None:
        self.head = head

    def answer_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def answer_end(self) -> None:
        pass


def sidecar_parse() -> None:
    sink = _Sink()
    AnswerParser(sink, "POST", 65536).feed(ANSWER)
    assert sink.head is not None and sink.head.status == 200


# The same answer as a slow tool's writes or small TCP segments bring it: each line of the
# head is checked as it arrives (so a bad one is refused without waiting for the head's end).
PIECES = [ANSWER[at : at + 16] for at in range(0, len(ANSWER), 16)]


def sidecar_parse_in_pieces() -> None:
    sink = _Sink()
    parser = AnswerParser(sink, "POST", 65536)
    for piece in PIECES:
        parser.feed(piece)
    assert sink.head is not None and sink.head.status == 200


def aiohttp_parser() -> Callable[[], None]:
    from aiohttp.http_parser import HttpResponseParser

    class Protocol:
        transport = None

        def pause_reading(self, **_: object) -> None: ...
        def resume_reading(self, **_: object) -> None: ...

    loop = asyncio.new_event_loop()
    parser = HttpResponseParser(
        Protocol(), loop, 2**16, response_with_body=True, read_until_eof=True
    )

    def parse() -> None:
        messages, _, _ = parser.feed_data(ANSWER)
        assert messages[0][0].code == 200

    return parse


def httptools_parser() -> Callable[[], None] | None:
    try:
        import httptools
    except ImportError:
        return None

    class Gather:
        __slots__ = ("body", "headers")

        def __init__(self) -> None:
            self.headers: CIMultiDict[str] = CIMultiDict()
            self.body: list[bytes] = []

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.add(name.decode(), value.decode())

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

    def parse() -> None:
        parser = httptools.HttpResponseParser(Gather())
        parser.feed_data(ANSWER)
        assert parser.get_status_code() == 200

    return parse


def main() -> None:
    candidates: dict[str, Callable[[], None] | None] = {
        "sidecar (strict, per answer)": sidecar_parse,
        "sidecar, in 16-byte reads": sidecar_parse_in_pieces,
        "aiohttp HttpResponseParser (0.3)": aiohttp_parser(),
        "httptools (llhttp binding)": httptools_parser(),
    }
    print(f"one {len(ANSWER)}-byte answer, best of 5 x {RUNS:,} parses")
    for name, parse in candidates.items():
        if parse is None:
            print(f"{name:34} not installed")
            continue
        best = min(timeit.repeat(parse, number=RUNS, repeat=5)) / RUNS
        print(f"{name:34} {best * 1e6:5.2f} µs")


if __name__ == "__main__":
    main()
