"""Answers written to the agent: the headers given, and only what HTTP itself requires.

aiohttp's writer names itself and its version in ``Server`` and labels an unlabelled body
``application/octet-stream``. A relayed answer would then carry headers the tool never
sent, and every answer would tell the network which versions to attack. The responses
here keep what aiohttp must add (``Date`` when absent, which RFC 9110 §6.6.1 asks of a
proxy; the framing; ``Connection``) and drop those two unless they were given.
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

_DEFAULTED = ("Server", "Content-Type")


def _absent(headers: CIMultiDict[str]) -> list[str]:
    return [name for name in _DEFAULTED if name not in headers]


class ExactResponse(web.Response):
    """A whole answer with no header aiohttp would add by default."""

    async def _prepare_headers(self) -> None:
        added = _absent(self.headers)
        await super()._prepare_headers()
        for name in added:
            self.headers.popall(name, None)


class ExactStreamResponse(web.StreamResponse):
    """A streamed answer with no header aiohttp would add by default."""

    async def _prepare_headers(self) -> None:
        added = _absent(self.headers)
        await super()._prepare_headers()
        for name in added:
            self.headers.popall(name, None)
