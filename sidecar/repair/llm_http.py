"""The HTTP client the ``openai`` client speaks to the model's endpoint through: every
answer read and inflated to at most ``SIDECAR_LLM_MAX_ANSWER_BYTES``, error answers too.

The ``openai`` client's own HTTP client inflates a compressed answer whole: a 3 KB brotli
answer that inflates to 4 GiB took the process past 3 GiB. Here the answer's raw bytes are
read as they come and counted, and inflated with the bound the tool's answers have
(``sidecar.tool.envelopes.decoded_text``); the client then gets the answer as plain bytes,
and has nothing left to inflate. Past the bound the call fails with ``AnswerTooLarge``,
which the repair layer counts as a repair given up.

The ``openai`` package speaks through ``httpx`` (1.x) or ``httpx2`` (later releases), the
same API under two names: the one its default client is built on is the one used here.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from sidecar.tool.envelopes import decoded_text

# A header about the bytes as sent, which no longer holds once they are inflated here.
_AS_SENT = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class AnswerTooLarge(Exception):
    """The model's endpoint answered more than the bound, as sent or inflated."""


class AnswerUnreadable(Exception):
    """The model's endpoint answered in an encoding that does not inflate."""


def bounded_http_client(client_module: Any, max_answer_bytes: int, **client_options: Any) -> Any:
    """``client_module.DefaultAsyncHttpxClient`` (the ``openai`` module) over a transport
    that bounds every answer to ``max_answer_bytes``."""
    default = client_module.DefaultAsyncHttpxClient
    http = _http_module(default)
    return default(transport=_BoundedTransport(http, max_answer_bytes), **client_options)


def _http_module(client_class: type) -> ModuleType:
    """The HTTP library ``client_class`` (an ``AsyncClient``) comes from."""
    base = next(cls for cls in client_class.__mro__ if cls.__name__ == "AsyncClient")
    return sys.modules[base.__module__.partition(".")[0]]


class _BoundedTransport:
    """An ``AsyncHTTPTransport`` whose answers are read whole, bounded, and inflated."""

    def __init__(self, http: ModuleType, max_answer_bytes: int) -> None:
        self._http = http
        self._inner = http.AsyncHTTPTransport()
        self._max = max_answer_bytes

    async def handle_async_request(self, request: Any) -> Any:
        answer = await self._inner.handle_async_request(request)
        try:
            raw = await self._read(answer.stream)
        finally:
            await answer.aclose()
        encoding = answer.headers.get("content-encoding")
        # One byte past the bound tells an answer at the bound from one beyond it.
        body = decoded_text(raw, encoding, self._max + 1) if raw else raw
        if body is None:
            raise AnswerUnreadable(f"an answer in {encoding!r} that does not inflate")
        if len(body) > self._max:
            raise AnswerTooLarge(f"an answer inflating past {self._max} bytes")
        headers = [
            (name, value)
            for name, value in answer.headers.multi_items()
            if name.lower() not in _AS_SENT
        ]
        return self._http.Response(
            answer.status_code, headers=headers, content=body, extensions=answer.extensions
        )

    async def _read(self, stream: Any) -> bytes:
        """The answer's bytes as sent, at most the bound of them."""
        pieces: list[bytes] = []
        size = 0
        async for piece in stream:
            size += len(piece)
            if size > self._max:
                raise AnswerTooLarge(f"an answer longer than {self._max} bytes")
            pieces.append(piece)
        return b"".join(pieces)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _BoundedTransport:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._inner.__aexit__(*exc_info)


def too_large_cause(error: BaseException) -> AnswerTooLarge | None:
    """The bound ``error`` was raised for, if it was: ``openai`` 1.x raises it as the cause
    of a connection error, later releases as it is."""
    for raised in (error, error.__cause__):
        if isinstance(raised, AnswerTooLarge):
            return raised
    return None
