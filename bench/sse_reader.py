"""The cost of finding the answer in an event stream that arrives in small chunks: the
sidecar's ``AnswerReader`` beside the reader 0.4 used (which looked only for the first
event, re-splitting everything read so far at every chunk), on the same bytes.

The stream is ``: ping`` comments (which both readers read past) and then the answer, fed
in 64-byte chunks, as a tool that keeps its connection alive while it works may send them.

    python bench/sse_reader.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sidecar.tool.eventstream import AnswerReader, rpc_id_text

CHUNK = 64
ANSWER = b'event: message\r\ndata: {"jsonrpc":"2.0","id":3,"result":{}}\r\n\r\n'
PING = b": ping\r\n\r\n"


def first_event_0_4(stream: bytes | bytearray) -> bytes | None:
    """0.4's ``envelopes.first_event``, the anchor: the first block with a non-comment line."""
    blocks = bytes(stream).replace(b"\r\n", b"\n").split(b"\n\n")
    for block in blocks[:-1]:
        if any(line and not line.startswith(b":") for line in block.split(b"\n")):
            return block
    return None


def read_0_4(chunks: list[bytes]) -> bool:
    """0.4's ``exchange._read_first_event`` loop, without the socket."""
    buffer = bytearray()
    for chunk in chunks:
        if first_event_0_4(buffer) is not None:
            return True
        buffer.extend(chunk)
    return first_event_0_4(buffer) is not None


def read_0_5(chunks: list[bytes]) -> bool:
    reader = AnswerReader(rpc_id_text(3), 1 << 30)
    return any(reader.feed(chunk) is not None for chunk in chunks)


def best_of_3(read: Callable[[list[bytes]], bool], chunks: list[bytes]) -> float:
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        assert read(chunks)
        timings.append(time.perf_counter() - started)
    return min(timings)


def main() -> None:
    print(f"{'stream':>8} {'chunks':>7} {'0.4 (ms)':>10} {'0.5 (ms)':>10} {'ratio':>7}")
    for kib in (16, 64, 256):
        stream = PING * (kib * 1024 // len(PING)) + ANSWER
        chunks = [stream[at : at + CHUNK] for at in range(0, len(stream), CHUNK)]
        old, new = best_of_3(read_0_4, chunks), best_of_3(read_0_5, chunks)
        print(
            f"{kib:>5} KiB {len(chunks):>7} {old * 1000:>10.1f} {new * 1000:>10.1f} "
            f"{old / new:>6.0f}x"
        )


if __name__ == "__main__":
    main()
