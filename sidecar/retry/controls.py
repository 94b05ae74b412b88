"""Per-request control headers from the agent. They can only lower the configured limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.config.values import REPAIR_LEVELS, RepairLevel

if TYPE_CHECKING:
    from sidecar.config.served import ServedTuning

MAX_RETRIES = "X-Sidecar-Max-Retries"
TIMEOUT_MS = "X-Sidecar-Timeout-Ms"
REPAIR = "X-Sidecar-Repair"
INTENT = "X-Sidecar-Intent"

_MAX_INTENT_CHARS = 2000


@dataclass(frozen=True, slots=True)
class RequestControls:
    max_retries: int
    timeout_s: float  # the whole request's deadline: every attempt, the first too
    retry_window_s: float  # no retry's wait or attempt starts after it, nor outlasts it
    repair: RepairLevel
    intent: str | None  # what the user asked for, for the LLM


def request_controls(tuning: ServedTuning, headers: Mapping[str, str]) -> RequestControls:
    """The route's limits, lowered where the agent asked; unreadable values are ignored."""
    max_retries = tuning.max_retries
    asked_retries = _non_negative_int(headers.get(MAX_RETRIES))
    if asked_retries is not None:
        max_retries = min(max_retries, asked_retries)

    # The agent's deadline is the whole request's, as the configured one is: lower only.
    timeout_ms = tuning.request_timeout_ms
    timeout_ms = min(timeout_ms, _non_negative_int(headers.get(TIMEOUT_MS)) or timeout_ms)

    repair = tuning.repair
    asked_repair = (headers.get(REPAIR) or "").strip().lower()
    for level in REPAIR_LEVELS[: REPAIR_LEVELS.index(repair)]:
        if asked_repair == level:
            repair = level

    intent = headers.get(INTENT)
    return RequestControls(
        max_retries=max_retries,
        timeout_s=timeout_ms / 1000,
        retry_window_s=min(tuning.retry_window_ms, timeout_ms) / 1000,
        repair=repair,
        intent=intent[:_MAX_INTENT_CHARS] if intent else None,
    )


def _non_negative_int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else None
