"""The words a setting may take, as plain ``Literal`` types.

The retry policy, the request controls and the repair pipeline type their values with
these. Nothing here imports pydantic or the loader, so those pure modules do not load it.
"""

from __future__ import annotations

from typing import Literal

JitterMode = Literal["full", "equal", "decorrelated", "none"]
RepairLevel = Literal["off", "deterministic", "auto"]
ReplayMode = Literal["safe", "always"]
CircuitScope = Literal["tool", "route"]
# Lowest first: a request may only move its route's level towards the front.
REPAIR_LEVELS: tuple[RepairLevel, ...] = ("off", "deterministic", "auto")
