"""The one seam to the tool: a pooled client, header rules, and one attempt at a time.

Foreign exceptions (aiohttp's, asyncio's timeouts) are translated into ``AttemptError``
here and nowhere else.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterable
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.errors import AttemptError

# RFC 9110 §7.6.1 plus the proxy-only fields RFC 2616 named; anything listed in
# ``Connection`` is hop-by-hop as well.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed or owned by this hop rather than passed on.
_NOT_FORWARDED_UPSTREAM = frozenset({"host", "content-length", "expect"})
CONTROL_HEADER_PREFIX = "x-sidecar-"

# aiohttp would add these when absent; a faithful proxy sends only what the agent sent.
_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")

RequestBody = bytes | AsyncIterable[bytes]


def create_session(max_connections: int) -> aiohttp.ClientSession:
    """The process-wide pool: no decompression, no cookies, no redirects, no own timeouts."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=_SKIP_AUTO_HEADERS,
        raise_for_status=False,
    )


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    return {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    }


def end_to_end_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str],
    also_drop: frozenset[str] = frozenset(),
    *,
    drop_control: bool = False,
) -> CIMultiDict[str]:
    """A copy without hop-by-hop fields, ``also_drop`` (lower-case names) and, when asked,
    the ``X-Sidecar-*`` control headers. One pass: this runs twice per request."""
    dropped = HOP_BY_HOP | also_drop
    if "Connection" in headers:
        dropped = dropped | _connection_tokens(headers)
    kept: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in dropped or (drop_control and lower.startswith(CONTROL_HEADER_PREFIX)):
            continue
        kept.add(name, value)
    return kept


def undeliverable_header(headers: CIMultiDictProxy[str]) -> str | None:
    """The name of a header whose bytes were not UTF-8, if any.

    aiohttp decodes such bytes to surrogates and its writer would silently drop them, so
    the tool would see a different value than the agent sent.
    """
    for name, value in headers.items():
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    client_address: str | None,
    scheme: str,
    request_id: str,
) -> CIMultiDict[str]:
    """What the tool receives: the agent's end-to-end headers plus the X-Forwarded-* set."""
    headers = end_to_end_headers(incoming, _NOT_FORWARDED_UPSTREAM, drop_control=True)
    if client_address:
        previous = incoming.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{previous}, {client_address}" if previous else client_address
    headers["X-Forwarded-Proto"] = scheme
    if "Host" in incoming:
        headers["X-Forwarded-Host"] = incoming["Host"]
    headers["X-Request-ID"] = request_id
    return headers


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """One call as it goes to the tool; replayed unchanged by retries."""

    method: str
    url: URL
    headers: CIMultiDict[str]
    body: RequestBody


@dataclass(slots=True)
class Answer:
    """The tool's answer: its body whole when ``complete``, else the part read so far.

    ``decisive`` says whether ``body`` holds what a decision needs: the whole body, or the
    first event of an event stream.
    """

    response: aiohttp.ClientResponse
    body: bytes
    complete: bool
    decisive: bool = False

    @property
    def status(self) -> int:
        return self.response.status

    def discard(self) -> None:
        """Give the connection back to the pool; aiohttp drops it if the body was not read."""
        self.response.release()


class BodyRead(enum.Enum):
    """How much of an answer is read before deciding on it."""

    NONE = "none"  # relay as it comes
    WHOLE = "whole"  # small enough to hold: read it all (the rest streams if it is not)
    FIRST_EVENT = "first_event"  # an event stream answering a call: its first event


def body_read(method: str, response: aiohttp.ClientResponse) -> BodyRead:
    """How much of the body can change what happens next.

    Error answers always can; a 2xx only through a JSON envelope (``success: false``) or,
    for an MCP call answered as an event stream, through its first event. Long-lived
    streams (``GET``), bodiless answers and other media go straight to the agent.
    """
    status = response.status
    if method == "HEAD" or status in (204, 304) or status < 200:
        return BodyRead.NONE
    content_type = response.content_type
    if content_type == "text/event-stream":
        return BodyRead.FIRST_EVENT if method == "POST" else BodyRead.NONE
    if status >= 400 or content_type == "application/json" or content_type.endswith("+json"):
        return BodyRead.WHOLE
    return BodyRead.NONE


async def exchange(
    session: aiohttp.ClientSession,
    request: UpstreamRequest,
    timeout_s: float,
    inspect_limit: int,
) -> Answer | AttemptError:
    """One attempt: the answer's headers, and its body when that matters and is small.

    ``timeout_s`` bounds the headers and any body read for inspection, never a body
    that is streamed to the agent afterwards.
    """
    response: aiohttp.ClientResponse | None = None
    try:
        async with asyncio.timeout(timeout_s):
            response = await session.request(
                request.method,
                request.url,
                headers=request.headers,
                data=request.body,
                allow_redirects=False,
            )
            mode = body_read(request.method, response)
            if mode is BodyRead.WHOLE:
                body, complete = await _read_up_to(response, inspect_limit)
                return Answer(response, body, complete, decisive=complete)
            if mode is BodyRead.FIRST_EVENT:
                first_event = await _read_first_event(response, inspect_limit)
                return Answer(response, first_event, complete=False, decisive=True)
            return Answer(response, b"", complete=False)
    except TimeoutError:
        error = AttemptError.TIMEOUT
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
        error = AttemptError.CONNECT
    except (aiohttp.ClientError, OSError):
        error = AttemptError.RESET
    except asyncio.CancelledError:
        # The agent went away mid-attempt: the half-read answer must not keep its socket.
        if response is not None:
            response.close()
        raise
    if response is not None:
        response.close()
    return error


async def _read_first_event(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The stream up to the end of its first event (or ``limit`` bytes, or its end)."""
    buffer = bytearray()
    while len(buffer) <= limit and b"\n\n" not in buffer and b"\r\n\r\n" not in buffer:
        chunk = await response.content.readany()
        if not chunk:
            break
        buffer.extend(chunk)
    return bytes(buffer)


async def _read_up_to(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """About ``limit`` bytes of the body at most, and whether that is all of it."""
    declared = response.content_length
    if declared is not None and declared > limit:
        return b"", False
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await response.content.readany()
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False
