"""Waits a tool asks for, in every spelling, as seconds — or ``None`` when none is usable.

First found wins: ``Retry-After`` (seconds or HTTP-date), ``RateLimit-Reset`` /
``X-RateLimit-Reset`` (seconds, or a Unix time when larger than now), the envelope's
``details.retry_after`` ("60s", "1500ms", "2m" or a number of seconds), MIRA's
``suggested_delay`` (milliseconds). A value that cannot be read, is negative or is not
finite is ignored, so the next source (or the backoff) applies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from sidecar.tool.envelopes import ToolFailure

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Shorter strings cannot be an HTTP-date; longer ones are not worth parsing.
_HTTP_DATE_LENGTHS = range(20, 40)


def requested_wait(
    headers: Mapping[str, str], failure: ToolFailure | None, now: float
) -> float | None:
    """The wait in seconds the answer asks for, ``now`` being the Unix time."""
    readers: tuple[Callable[[], float | None], ...] = (
        lambda: retry_after_seconds(headers.get("Retry-After"), now),
        lambda: reset_seconds(headers.get("RateLimit-Reset"), now),
        lambda: reset_seconds(headers.get("X-RateLimit-Reset"), now),
        lambda: duration_seconds(failure.retry_after) if failure else None,
        lambda: milliseconds(failure.suggested_delay_ms) if failure else None,
    )
    for reader in readers:
        wait = reader()
        if wait is not None:
            return wait
    return None


def _finite_non_negative(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """``Retry-After``: delay-seconds or an HTTP-date (a date in the past means now)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²" is a digit to str.isdigit, not to float()
        return float(value)
    if len(value) not in _HTTP_DATE_LENGTHS:
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def reset_seconds(value: str | None, now: float) -> float | None:
    """``RateLimit-Reset``: seconds to wait, or the Unix time to wait until."""
    if value is None:
        return None
    try:
        number = _finite_non_negative(float(value.strip()))
    except ValueError:
        return None
    if number is None:
        return None
    return number - now if number > now else number


def duration_seconds(value: Any) -> float | None:
    """An envelope duration: a number of seconds, or "60s", "1500ms", "2m", "1h"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _finite_non_negative(float(value))
    if not isinstance(value, str):
        return None
    match = _DURATION.match(value)
    if match is None:
        return None
    number, unit = match.groups()
    return _finite_non_negative(float(number) * _UNIT_SECONDS[(unit or "s").lower()])


def milliseconds(value: Any) -> float | None:
    """MIRA's ``suggested_delay``: a number of milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return _finite_non_negative(value / 1000)
