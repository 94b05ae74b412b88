"""A test's tap in front of an MCP server: the headers an MCP client's request and the
server's answer carry across it, and the answer streamed back to the client as it comes."""

from __future__ import annotations

import aiohttp
from aiohttp import web

ASKED = ("Content-Type", "Accept", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID")
ANSWERED = ("Content-Type", "Mcp-Session-Id", "Cache-Control")


def asked(request: web.Request) -> dict[str, str]:
    """The request's headers an MCP server reads."""
    return {name: request.headers[name] for name in ASKED if name in request.headers}


async def answer_head(request: web.Request, answer: aiohttp.ClientResponse) -> web.StreamResponse:
    """The server's answer's status and MCP headers, sent to the client."""
    relayed = web.StreamResponse(
        status=answer.status,
        headers={name: answer.headers[name] for name in ANSWERED if name in answer.headers},
    )
    await relayed.prepare(request)
    return relayed


async def relay_rest(
    relayed: web.StreamResponse, answer: aiohttp.ClientResponse
) -> web.StreamResponse:
    """The rest of ``answer``'s body, chunk by chunk as it arrives, then its end."""
    async for chunk in answer.content.iter_any():
        await relayed.write(chunk)
    await relayed.write_eof()
    return relayed
