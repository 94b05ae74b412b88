"""The tool's own suggestions, applied as given.

Two sources: MIRA's ``recovery.retry_strategy.parameter_adjustments`` (field → value, a
dotted name reaching into nested objects), and ``error.details`` members named after a
payload field with a ``suggested_`` or ``expected_`` prefix. Only fields the payload
already has are changed by the second kind: a detail that names nothing in the payload is
information, not a suggestion.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from sidecar.tool.envelopes import ToolFailure

_PREFIXES = ("suggested_", "expected_")


def suggestions(failure: ToolFailure, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Field → value pairs the tool proposed for this payload."""
    proposed: dict[str, Any] = {}
    for name, value in failure.details.items():
        for prefix in _PREFIXES:
            field = name.removeprefix(prefix)
            if name.startswith(prefix) and _get(payload, field) is not _MISSING:
                proposed[field] = value
    proposed.update({name: value for name, value in failure.parameter_adjustments.items() if name})
    return proposed


def adjust(payload: dict[str, Any], failure: ToolFailure) -> tuple[dict[str, Any], list[str]]:
    """The payload with the tool's suggestions applied, and the fields that changed."""
    adjusted = copy.deepcopy(payload)
    changed = []
    for field, value in suggestions(failure, payload).items():
        if _get(adjusted, field) != value and _set(adjusted, field, value):
            changed.append(field)
    return adjusted, changed


_MISSING = object()


def _get(payload: Mapping[str, Any], field: str) -> Any:
    node: Any = payload
    for part in field.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(payload: dict[str, Any], field: str, value: Any) -> bool:
    *parents, leaf = field.split(".")
    node: Any = payload
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            return False
        node = child
    node[leaf] = copy.deepcopy(value)
    return True
