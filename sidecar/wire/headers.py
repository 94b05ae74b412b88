"""Which headers cross the sidecar, and how: hop-by-hop fields, ``X-Forwarded-*``, the
``X-Sidecar-*`` headers that belong to the sidecar alone."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

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
# Owned by this hop rather than passed on: ``Host`` names the tool, and ``Expect`` was
# answered by the sidecar itself. (``Content-Length`` goes on, restated for a body the
# sidecar changed.)
_NOT_FORWARDED_UPSTREAM = frozenset({"host", "expect"})
CONTROL_HEADER_PREFIX = "x-sidecar-"


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
    the ``X-Sidecar-*`` headers (the agent's control headers; in an answer, the tool's
    forgeries of the sidecar's report). One pass: this runs twice per request."""
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

    aiohttp's parser decodes such bytes to surrogates, which cannot be written out as they
    came: the other side would see a different value than was sent.
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
