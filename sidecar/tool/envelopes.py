"""Reading a tool's error envelope, whatever its dialect, into one ``ToolFailure``.

Recognised: GoMind ``ToolResponse``, the MIRA bot format, RFC 9457 problem details,
JSON-RPC 2.0 errors and MCP tool results with ``isError`` (also as the event of a
``text/event-stream`` body that answers the call: ``eventstream``). Anything else yields
``None``: the status code alone decides.
Parsing never raises; a body that is not what it claims is simply not an envelope.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sidecar.tool.json_value import parse_json

# A compressed body is inflated for inspection only up to this size: a few hundred KiB of
# JSON is plenty to judge, and a zip bomb inflates no further.
MAX_INFLATED_BYTES = 1024 * 1024
# The largest zstd window decoded: RFC 9659 asks HTTP encoders to stay within 8 MiB, and a
# frame that asks for more would make the decoder allocate it.
_ZSTD_MAX_WINDOW = 8 * 1024 * 1024
# How much of an error body's text is kept for pattern matching (and, later, prompts).
TEXT_SAMPLE_BYTES = 4096

CATEGORY_STATUS = {
    "INPUT_ERROR": 400,
    "NOT_FOUND": 404,
    "AUTH_ERROR": 401,
    "RATE_LIMIT": 429,
    "SERVICE_ERROR": 503,
}

# JSON-RPC 2.0 reserved codes, read as the category a ToolResponse would carry.
_JSONRPC_CATEGORY = {
    -32700: "INPUT_ERROR",
    -32600: "INPUT_ERROR",
    -32601: "NOT_FOUND",
    -32602: "INPUT_ERROR",
    -32603: "SERVICE_ERROR",
}


@dataclass(frozen=True, slots=True)
class ToolFailure:
    """What a tool said went wrong, in one shape for every dialect."""

    dialect: str
    code: str = ""
    message: str = ""
    category: str = ""
    retryable: bool | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    # Upstream-requested wait as the envelope spelled it, interpreted by ``waits``.
    retry_after: Any = None
    suggested_delay_ms: Any = None
    parameter_adjustments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    """What one attempt brought back, as far as deciding needs it."""

    status: int
    failure: ToolFailure | None = None
    text: str = ""  # the start of the (decoded) body, for plain-text validation errors
    # A proxy beside the tool answered for it after losing a call that may have reached it.
    lost_after_delivery: bool = False


def decoded_text(
    body: bytes, content_encoding: str | None, limit: int = MAX_INFLATED_BYTES
) -> bytes | None:
    """The body as its sender meant it: inflated when gzip, deflate, br or zstd (at most
    ``limit`` bytes of it), ``None`` if it won't inflate."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _inflate_zlib(body, encoding, limit)
    if encoding == "br":
        return _inflate_brotli(body, limit)
    if encoding == "zstd":
        return _inflate_zstd(body, limit)
    return None


def _inflate_zlib(body: bytes, encoding: str, limit: int) -> bytes | None:
    wbits = zlib.MAX_WBITS | 32 if encoding != "deflate" else zlib.MAX_WBITS
    for bits in (wbits, -zlib.MAX_WBITS):  # deflate is sometimes sent raw
        try:
            inflater = zlib.decompressobj(bits)
            return inflater.decompress(body, limit)
        except zlib.error:
            continue
    return None


def _inflate_brotli(body: bytes, limit: int) -> bytes | None:
    import brotli  # loaded with the first br body: most tools never send one

    try:
        # The limit stops the output buffer growing; it may overshoot by one step.
        inflated: bytes = brotli.Decompressor().process(body, output_buffer_limit=limit)
    except brotli.error:
        return None
    return inflated[:limit]


def _inflate_zstd(body: bytes, limit: int) -> bytes | None:
    import zstandard  # loaded with the first zstd body

    decompressor = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    pieces: list[bytes] = []
    size = 0
    try:
        with decompressor.stream_reader(body, read_across_frames=True) as reader:
            while size < limit:
                piece = reader.read(limit - size)
                if not piece:
                    break
                pieces.append(piece)
                size += len(piece)
    except zstandard.ZstdError:
        return None
    return b"".join(pieces)


def json_document(body: bytes, content_encoding: str | None) -> Any:
    """The JSON value an answer's body (or the event that answered) holds, or ``None``."""
    raw = decoded_text(body, content_encoding) if body else None
    return parse_json(raw) if raw else None


def inspect(
    status: int, body: bytes, content_encoding: str | None
) -> tuple[ToolFailure | None, str]:
    """The failure an answer's body describes, and the start of its text for error statuses.

    ``body`` is the whole body, or for ``text/event-stream`` the data of the event that
    answered the call.
    """
    raw = decoded_text(body, content_encoding) if body else None
    if not raw:
        return None, ""
    failure = parse_failure(parse_json(raw), success_status=200 <= status < 300)
    text = raw[:TEXT_SAMPLE_BYTES].decode("utf-8", "replace") if status >= 400 else ""
    return failure, text


def parse_failure(document: Any, *, success_status: bool) -> ToolFailure | None:
    """The failure a parsed JSON document describes, or ``None``.

    ``success_status`` tells whether the HTTP status was 2xx: there only an explicit
    failure marker (``success: false``, a JSON-RPC error, ``isError``) makes a failure.
    """
    if not isinstance(document, dict):
        return None
    if document.get("jsonrpc") == "2.0":
        return _jsonrpc(document)
    error = document.get("error")
    if isinstance(error, dict):
        if document.get("success") is True:
            return None
        if success_status and document.get("success") is not False:
            return None
        if isinstance(error.get("recovery"), dict):
            return _mira(error)
        return _gomind(error)
    if document.get("success") is False:
        return ToolFailure(dialect="gomind", message=_text(error))
    if (
        not success_status
        and ("title" in document or "type" in document)
        and ("status" in document or "detail" in document)
    ):
        return _problem(document)
    return None


def _text(value: Any, limit: int = 2000) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value[:limit]
    try:
        return orjson.dumps(value, default=str).decode()[:limit]
    except TypeError:  # integers past 64 bits
        return str(value)[:limit]


def _flag(value: Any) -> bool | None:
    """A real boolean only: ``"yes"`` or ``1`` say nothing reliable about retrying."""
    return value if isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _category(value: Any) -> str:
    return value.strip().upper() if isinstance(value, str) else ""


def _gomind(error: dict[str, Any]) -> ToolFailure:
    details = _mapping(error.get("details"))
    return ToolFailure(
        dialect="gomind",
        code=_text(error.get("code"), 200),
        message=_text(error.get("message")),
        category=_category(error.get("category")),
        retryable=_flag(error.get("retryable")),
        details=details,
        retry_after=details.get("retry_after"),
    )


def _mira(error: dict[str, Any]) -> ToolFailure:
    recovery = _mapping(error.get("recovery"))
    strategy = _mapping(recovery.get("retry_strategy"))
    context = _mapping(error.get("context"))
    details = _mapping(error.get("details")) or context
    return ToolFailure(
        dialect="mira",
        code=_text(error.get("code"), 200),
        message=_text(error.get("message")),
        category=_category(error.get("category")),
        retryable=_flag(recovery.get("is_retryable")),
        details=details,
        retry_after=details.get("retry_after"),
        suggested_delay_ms=strategy.get("suggested_delay"),
        parameter_adjustments=_mapping(strategy.get("parameter_adjustments")),
    )


def _problem(document: dict[str, Any]) -> ToolFailure:
    return ToolFailure(
        dialect="problem",
        code=_text(document.get("title") or document.get("type"), 200),
        message=_text(document.get("detail")),
        retryable=_flag(document.get("retryable")),
        details={
            key: value
            for key, value in document.items()
            if key not in ("type", "title", "status", "detail", "instance", "retryable")
        },
        retry_after=document.get("retry_after"),
    )


def _jsonrpc(document: dict[str, Any]) -> ToolFailure | None:
    error = document.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        data = error.get("data")
        return ToolFailure(
            dialect="jsonrpc",
            code=_text(code, 200),
            message=_text(error.get("message")),
            category=_JSONRPC_CATEGORY.get(code, "") if isinstance(code, int) else "",
            retryable=_flag(_mapping(data).get("retryable")),
            details=_mapping(data),
            retry_after=_mapping(data).get("retry_after"),
        )
    result = document.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        content = result.get("content")
        texts = [
            item["text"]
            for item in (content if isinstance(content, list) else [])
            if isinstance(item, dict) and isinstance(item.get("text"), str)
        ]
        return ToolFailure(dialect="mcp", message=_text("\n".join(texts)))
    return None
