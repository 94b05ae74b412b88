"""Schema-driven coercion: ``"35.6"`` → ``35.6`` where the schema says number.

Only a value the schema rejects is touched, and only when the conversion is exact
(``"5"`` → ``5``, never ``"5.5"`` → ``5``; ASCII digits only, as pydantic and most tools
read numbers); a value that cannot be coerced is left as it was. A value that already fits
its schema is never changed.

Objects (``properties``, ``patternProperties``, ``additionalProperties``), arrays
(``items``, ``prefixItems``), ``allOf`` and nullable types are followed. A union
(``anyOf``/``oneOf``) is entered only when the branch is certain: the one an OpenAPI
``discriminator`` names, else the only branch the coerced value then fits, else — for an
object or array — the only branch that takes that JSON type at all (``Model | None``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from sidecar.repair.jsontext import same
from sidecar.repair.schemas import BRANCH_INDEX

_MAX_DEPTH = 64
_SPACE = " \t\n\r"
_INTEGER = re.compile(r"[-+]?[0-9]+")
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# A float at or past 2**53 may stand for an integer the parser could not hold exactly:
# its digits are not known, so it is not written out as a string.
_EXACT_FLOAT_LIMIT = 2.0**53


def coerce(value: Any, schema: Any) -> tuple[Any, list[str]]:
    """``value`` coerced to ``schema``, and the paths (``a.b[0]``, ``$``) of what changed."""
    changed: list[str] = []
    return _coerce(value, schema, "", changed, 0), changed


def _coerce(value: Any, schema: Any, path: str, changed: list[str], depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return value
    parts = schema.get("allOf")
    for part in parts if isinstance(parts, list) else ():
        value = _coerce(value, part, path, changed, depth + 1)
    for keyword in ("oneOf", "anyOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            value = _coerce_union(value, schema, keyword, branches, path, changed, depth)

    types = _types(schema)
    if isinstance(value, dict):
        if not types or "object" in types:
            return _coerce_object(value, schema, path, changed, depth)
    elif isinstance(value, list):
        if not types or "array" in types:
            return _coerce_array(value, schema, path, changed, depth)
    elif types and not _fits_type(value, types):
        for wanted in types:
            converted = _convert(value, wanted)
            if converted is not _NOT_CONVERTED:
                changed.append(path or "$")
                return converted
    return value


def _coerce_object(
    value: dict[str, Any], schema: dict[str, Any], path: str, changed: list[str], depth: int
) -> dict[str, Any]:
    properties = _mapping(schema.get("properties"))
    patterns = _mapping(schema.get("patternProperties"))
    extra = schema.get("additionalProperties")
    result = {}
    for key, item in value.items():
        child_path = f"{path}.{key}" if path else key
        # Every subschema JSON Schema applies to this member, and only those.
        applying = [properties[key]] if key in properties else []
        applying += [sub for pattern, sub in patterns.items() if _matches(pattern, key)]
        if not applying and isinstance(extra, dict):
            applying = [extra]
        for child in applying:
            item = _coerce(item, child, child_path, changed, depth + 1)
        result[key] = item
    return result


def _coerce_array(
    value: list[Any], schema: dict[str, Any], path: str, changed: list[str], depth: int
) -> list[Any]:
    prefix = schema.get("prefixItems")
    items = schema.get("items")
    if isinstance(items, list):  # the tuple form before JSON Schema 2020-12
        prefix, items = items, schema.get("additionalItems")
    prefix = prefix if isinstance(prefix, list) else []
    return [
        _coerce(
            item,
            prefix[index] if index < len(prefix) else items,
            f"{path}[{index}]",
            changed,
            depth + 1,
        )
        for index, item in enumerate(value)
    ]


def _coerce_union(
    value: Any,
    schema: dict[str, Any],
    keyword: str,
    branches: list[Any],
    path: str,
    changed: list[str],
    depth: int,
) -> Any:
    if _valid(value, {keyword: branches}):
        return value
    chosen = _discriminated(value, schema, branches)
    if chosen is not None:
        return _coerce(value, chosen, path, changed, depth + 1)

    outcomes: list[tuple[Any, list[str]]] = []
    for branch in branches:
        attempt: list[str] = []
        candidate = _coerce(value, branch, path, attempt, depth + 1)
        if _valid(candidate, branch) and not any(same(candidate, seen) for seen, _ in outcomes):
            outcomes.append((candidate, attempt))
    if len(outcomes) == 1:
        candidate, attempt = outcomes[0]
        changed.extend(attempt)
        return candidate
    if not outcomes and isinstance(value, dict | list):
        kind = "object" if isinstance(value, dict) else "array"
        taking = [branch for branch in branches if _takes(branch, kind)]
        if len(taking) == 1:
            return _coerce(value, taking[0], path, changed, depth + 1)
    return value


def _discriminated(value: Any, schema: dict[str, Any], branches: list[Any]) -> Any:
    """The branch an OpenAPI discriminator names for this object, if it names one."""
    discriminator = schema.get("discriminator")
    if not isinstance(discriminator, dict) or not isinstance(value, dict):
        return None
    name = discriminator.get("propertyName")
    if not isinstance(name, str):
        return None
    tag = value.get(name)
    if not isinstance(tag, str):
        return None
    index = _mapping(discriminator.get(BRANCH_INDEX)).get(tag)
    if isinstance(index, int) and 0 <= index < len(branches):
        return branches[index]
    declaring = [branch for branch in branches if _declares(branch, name, tag)]
    return declaring[0] if len(declaring) == 1 else None


def _declares(branch: Any, name: str, tag: str) -> bool:
    """Whether ``branch`` pins property ``name`` to ``tag`` (``const`` or ``enum``)."""
    prop = _mapping(_mapping(branch).get("properties")).get(name)
    if not isinstance(prop, dict):
        return False
    enum = prop.get("enum")
    return prop.get("const") == tag or (isinstance(enum, list) and tag in enum)


def _takes(branch: Any, kind: str) -> bool:
    if not isinstance(branch, dict):
        return True
    types = _types(branch)
    return not types or kind in types


def _valid(value: Any, schema: Any) -> bool:
    """Whether ``value`` fits ``schema``; a schema the validator cannot read fits nothing."""
    # Loaded with the first coercion: a sidecar whose routes have no schema never needs it.
    import jsonschema
    import referencing.exceptions

    try:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(value))
    except (
        jsonschema.exceptions.SchemaError,
        jsonschema.exceptions.UnknownType,
        referencing.exceptions.Unresolvable,
        re.error,
        RecursionError,
        TypeError,
        ValueError,
        AttributeError,
    ):
        return False


def _matches(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except (re.error, TypeError):
        return False


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [kind for kind in declared if isinstance(kind, str)]
    return []


def _fits_type(value: Any, types: list[str]) -> bool:
    kind = _json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


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
        return _from_text(value.strip(_SPACE), wanted)
    if wanted == "string" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if wanted == "string" and isinstance(value, float) and abs(value) < _EXACT_FLOAT_LIMIT:
        return repr(value)
    return _NOT_CONVERTED


def _from_text(text: str, wanted: str) -> Any:
    if wanted in ("integer", "number") and _INTEGER.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than Python converts
            return _NOT_CONVERTED
    if wanted == "number" and _NUMBER.fullmatch(text):
        number = float(text)
        return number if math.isfinite(number) else _NOT_CONVERTED
    if wanted == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if wanted == "null" and text.lower() == "null":
        return None
    return _NOT_CONVERTED
