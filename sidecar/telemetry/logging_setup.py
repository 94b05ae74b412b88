"""How every log line of the process is configured: the structlog chain (JSON or console,
credentials masked), the level gate for libraries, and the logger the HTTP server reports
through.

What each event of a request logs is the log sink's business (``telemetry.logs``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import orjson
import structlog

from sidecar.credentials import MASK, is_secret_name, mask_path


class _ClientFaultFilter(logging.Filter):
    """aiohttp logs a malformed request as a server error with a traceback (an unknown
    method on a new connection only at debug). It is the client's fault and the client
    already got its 400, so it becomes one info line."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Imported here: ``serve`` configures logging before it hands off to the served
        # interpreter (``serve.handoff``), which alone needs aiohttp.
        from aiohttp.http_exceptions import HttpProcessingError

        fault = record.exc_info[1] if record.exc_info else None
        if isinstance(fault, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "malformed_request", ()
            record.reason = fault.message.strip().splitlines()[0].rstrip(":")
            record.exc_info = record.exc_text = None
        return True


def http_server_logger() -> logging.Logger:
    """The logger the proxy's HTTP server reports through."""
    logger = logging.getLogger("sidecar.http")
    # Every record is made, debug ones too, so the filter sees each malformed request;
    # the handler's gate then applies the configured level.
    logger.setLevel(logging.DEBUG)
    if not any(isinstance(existing, _ClientFaultFilter) for existing in logger.filters):
        logger.addFilter(_ClientFaultFilter())
    return logger


class _LevelGate(logging.Filter):
    """The sidecar's own records from the configured level, everyone else's (httpx,
    httpcore, openai, aiohttp, asyncio …) from WARNING at least: their debug and info
    lines are free text, one per connection step, and print URLs as they were given.

    The root logger's level does the same, but a library may set its own logger's level
    (``OPENAI_LOG=debug`` does): this gate holds whatever they set.
    """

    def __init__(self, own_level: int) -> None:
        super().__init__()
        self._own_level = own_level
        self._foreign_level = max(own_level, logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == "sidecar" or record.name.startswith("sidecar.")
        return record.levelno >= (self._own_level if own else self._foreign_level)


def _mask_secrets(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor: credentials out of a line's message, fields and traceback.

    Values under secret-looking names are masked whole; every other text (and anything
    the renderer would turn into text) loses URL userinfo, credential query values and
    HTTP credentials.
    """
    return {name: _masked(name, value) for name, value in event.items()}


def _masked(name: str, value: Any) -> Any:
    if value is not None and is_secret_name(name):
        return MASK
    if isinstance(value, Mapping):
        return {key: _masked(str(key), item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_masked(name, item) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return mask_path(value if isinstance(value, str) else str(value))


def _orjson_dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Every line the process logs, its own and its libraries', through one chain.

    One JSON object per line on stdout (or coloured lines for people); credentials are
    masked in each; libraries speak from WARNING up whatever the level.
    """
    stream = stream or sys.stdout
    # A line that cannot be written (stdout closed under ``| head``) is dropped, not
    # reported with a traceback on stderr.
    logging.raiseExceptions = False
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    # Tracebacks become text first, so the masking reaches them too.
    last = [structlog.processors.format_exc_info, _mask_secrets, renderer]
    numeric_level = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[*shared, *last],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.addFilter(_LevelGate(numeric_level))
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *last],
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric_level, logging.WARNING))
    logging.getLogger("sidecar").setLevel(numeric_level)
    # Python's warnings (a coroutine never awaited, a deprecation) are lines too.
    logging.captureWarnings(True)
