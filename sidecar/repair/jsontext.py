"""JSON text edited in place: the values that change are rewritten, every other byte stays.

A payload is parsed into Python values to decide what to repair, but it is never sent as
those values re-serialised: an integer past 64 bits read by ``orjson`` comes back as a float,
``1.50`` as ``1.5``, ``"\\u00e9"`` as ``"é"``. Instead the text is read again only along the
paths where values differ, to find where each member or item sits (the standard library's C
scanner steps over the rest), and only the values that differ are replaced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # typeshed omits it
from typing import Any

# Changes nested deeper than this are re-serialised from their container down.
_MAX_DEPTH = 128
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SCANNER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Element:
    """Where one member of an object, or one item of an array, sits in the text."""

    key: str | None  # an array item has none
    key_start: int  # the key's text, quotes included (empty for an item)
    key_end: int
    start: int  # the value's text
    end: int


def elements(text: str, position: int) -> tuple[list[Element], int]:
    """The members of the object (or items of the array) opening at ``position``, in text
    order, and where it ends. Raises ``ValueError`` or ``IndexError`` on text not JSON."""
    closer = {"{": "}", "[": "]"}[text[position]]
    found: list[Element] = []
    position = _skip(text, position + 1)
    if text[position] == closer:
        return found, position + 1
    while True:
        key, key_start, key_end = None, position, position
        if closer == "}":
            if text[position] != '"':
                raise ValueError("expected a key")
            key, key_end = scanstring(text, position + 1, True)
            colon = _skip(text, key_end)
            if text[colon] != ":":
                raise ValueError("expected ':'")
            position = _skip(text, colon + 1)
        _, end = _SCANNER.raw_decode(text, position)
        found.append(Element(key, key_start, key_end, position, end))
        position = _skip(text, end)
        if text[position] == closer:
            return found, position + 1
        if text[position] != ",":
            raise ValueError(f"expected ',' or {closer!r}")
        position = _skip(text, position + 1)


def _skip(text: str, position: int) -> int:
    match = _WHITESPACE.match(text, position)
    return match.end() if match else position


def same(left: Any, right: Any) -> bool:
    """Equal as JSON: ``1``, ``1.0`` and ``true`` are three different values."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    return bool(left == right)


def dumps(value: Any) -> str:
    """Compact JSON for a value that has no text yet (integers of any size included)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def rewrite(text: str, old: Any, new: Any) -> str:
    """``text``, which is JSON reading as ``old``, changed to read as ``new``.

    Every value equal in both keeps its exact text, whitespace around it included; an
    object whose keys did not change keeps its key order and layout. Text that is not JSON
    is replaced by ``new`` as a whole.
    """
    try:
        start = _skip(text, 0)
        _, end = _SCANNER.raw_decode(text, start)
        return text[:start] + _render(text, start, end, old, new, 0) + text[end:]
    except (ValueError, IndexError, KeyError, RecursionError):
        return dumps(new)


def _render(text: str, start: int, end: int, old: Any, new: Any, depth: int) -> str:
    if same(old, new):
        return text[start:end]
    if depth > _MAX_DEPTH:
        return dumps(new)
    if isinstance(old, dict) and isinstance(new, dict):
        members, _ = elements(text, start)
        keys = [member.key for member in members]
        if old.keys() == new.keys() and len(set(keys)) == len(keys):
            return _splice(text, start, end, [(m, old[m.key], new[m.key]) for m in members], depth)
        # The last of repeated keys is the one every parser reads.
        last = {member.key: member for member in members}
        rendered = []
        for key, value in new.items():
            member = last.get(key)
            if member is None or key not in old:
                rendered.append(f"{dumps(key)}:{dumps(value)}")
                continue
            value_text = _render(text, member.start, member.end, old[key], value, depth + 1)
            rendered.append(f"{text[member.key_start : member.key_end]}:{value_text}")
        return "{" + ",".join(rendered) + "}"
    if isinstance(old, list) and isinstance(new, list):
        items, _ = elements(text, start)
        if len(old) == len(new) == len(items):
            return _splice(text, start, end, list(zip(items, old, new, strict=True)), depth)
        kept = min(len(items), len(old))
        return (
            "["
            + ",".join(
                _render(text, items[index].start, items[index].end, old[index], value, depth + 1)
                if index < kept
                else dumps(value)
                for index, value in enumerate(new)
            )
            + "]"
        )
    return dumps(new)


def _splice(
    text: str, start: int, end: int, children: list[tuple[Element, Any, Any]], depth: int
) -> str:
    """The container's own text with each child, in text order, rendered in its place."""
    pieces = []
    position = start
    for child, old, new in children:
        pieces.append(text[position : child.start])
        pieces.append(_render(text, child.start, child.end, old, new, depth + 1))
        position = child.end
    pieces.append(text[position:end])
    return "".join(pieces)
