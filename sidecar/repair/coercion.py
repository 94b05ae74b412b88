"""Schema-driven coercion: ``"35.6"`` → ``35.6`` where the schema says number.

Only values whose type is wrong are touched, and only when the conversion is exact
(``"5"`` → ``5``, never ``"5.5"`` → ``5``); a value that cannot be coerced is left as it
was. Objects, arrays, ``anyOf``/``oneOf``/``allOf`` and nullable types are followed.
"""

from __future__ import annotations

import math
import re
from typing import Any

_INTEGER = re.compile(r"^\s*[-+]?\d{1,18}\s*$")
_MAX_DEPTH = 64


def coerce(value: Any, schema: Any) -> tuple[Any, list[str]]:
    """``value`` coerced to ``schema``, and the paths (``a.b[0]``) of what changed."""
    changed: list[str] = []
    return _coerce(value, schema, "", changed, 0), changed


def _coerce(value: Any, schema: Any, path: str, changed: list[str], depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return value
    for part in schema.get("allOf", ()) if isinstance(schema.get("allOf"), list) else ():
        value = _coerce(value, part, path, changed, depth + 1)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        return _coerce_branches(value, branches, path, changed, depth)

    types = _types(schema)
    if isinstance(value, dict) and (not types or "object" in types):
        return _coerce_object(value, schema, path, changed, depth)
    if isinstance(value, list) and (not types or "array" in types):
        items = schema.get("items")
        return [
            _coerce(item, items, f"{path}[{index}]", changed, depth + 1)
            for index, item in enumerate(value)
        ]
    if (
        not types
        or _json_type(value) in types
        or ("number" in types and _json_type(value) == "integer")
    ):
        return value
    for wanted in types:
        converted = _convert(value, wanted)
        if converted is not _NOT_CONVERTED:
            changed.append(path or "$")
            return converted
    return value


def _coerce_object(
    value: dict[str, Any], schema: dict[str, Any], path: str, changed: list[str], depth: int
) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    extra = schema.get("additionalProperties")
    result = {}
    for key, item in value.items():
        child = properties.get(key, extra if isinstance(extra, dict) else None)
        result[key] = _coerce(item, child, f"{path}.{key}" if path else key, changed, depth + 1)
    return result


def _coerce_branches(
    value: Any, branches: list[Any], path: str, changed: list[str], depth: int
) -> Any:
    """The first branch the value already fits wins; else the first that converts it."""
    for branch in branches:
        if isinstance(branch, dict) and _fits(value, branch):
            return _coerce(value, branch, path, changed, depth + 1)
    for branch in branches:
        attempt: list[str] = []
        converted = _coerce(value, branch, path, attempt, depth + 1)
        if attempt:
            changed.extend(attempt)
            return converted
    return value


def _fits(value: Any, schema: dict[str, Any]) -> bool:
    types = _types(schema)
    kind = _json_type(value)
    return not types or kind in types or (kind == "integer" and "number" in types)


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [kind for kind in declared if isinstance(kind, str)]
    return []


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


_NOT_CONVERTED = object()


def _convert(value: Any, wanted: str) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if wanted == "integer" and _INTEGER.match(text):
            return int(text)
        if wanted == "number":
            if _INTEGER.match(text):
                return int(text)
            try:
                number = float(text)
            except ValueError:
                return _NOT_CONVERTED
            return number if math.isfinite(number) else _NOT_CONVERTED
        if wanted == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if wanted == "null" and text.lower() == "null":
            return None
        return _NOT_CONVERTED
    if wanted == "string" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if wanted == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return _NOT_CONVERTED
