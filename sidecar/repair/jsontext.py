"""JSON text edited in place: the values that change are rewritten, every other byte stays.

A payload is parsed into Python values to decide what to repair, but it is never sent as
those values re-serialised: an integer past 64 bits read by ``orjson`` comes back as a float,
``1.50`` as ``1.5``, ``"\\u00e9"`` as ``"é"``. Instead the text is read once more into a tree
of spans (where each value starts and ends) and only the values that differ are replaced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any

# Deep enough for any real payload; deeper documents are re-serialised whole instead.
_MAX_DEPTH = 128
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS = ("true", "false", "null")


@dataclass(slots=True)
class Span:
    """Where one JSON value sits in the text, and where its members or items sit."""

    start: int
    end: int
    # An object's members by key (the last one wins, as in every JSON parser): the span of
    # the key's own text (quotes included) and of its value.
    members: dict[str, tuple[int, int, Span]] | None = None
    repeated_keys: bool = False
    items: list[Span] | None = None  # an array's


def read(text: str) -> Span | None:
    """The span tree of a JSON text, or ``None`` when it is not (RFC 8259) JSON."""
    try:
        span = _value(text, _skip(text, 0), 0)
    except (ValueError, IndexError):  # json.JSONDecodeError is a ValueError
        return None
    return span if _skip(text, span.end) == len(text) else None


def _skip(text: str, position: int) -> int:
    match = _WHITESPACE.match(text, position)
    return match.end() if match else position


def _value(text: str, position: int, depth: int) -> Span:
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deep")
    first = text[position]
    if first == "{":
        return _object(text, position, depth)
    if first == "[":
        return _array(text, position, depth)
    if first == '"':
        return Span(position, scanstring(text, position + 1, True)[1])
    number = _NUMBER.match(text, position)
    if number:
        return Span(position, number.end())
    for literal in _LITERALS:
        if text.startswith(literal, position):
            return Span(position, position + len(literal))
    raise ValueError(f"unexpected {first!r}")


def _object(text: str, start: int, depth: int) -> Span:
    members: dict[str, tuple[int, int, Span]] = {}
    span = Span(start, start, members=members)

    def member(position: int) -> int:
        if text[position] != '"':
            raise ValueError("expected a key")
        key, key_end = scanstring(text, position + 1, True)
        colon = _skip(text, key_end)
        if text[colon] != ":":
            raise ValueError("expected ':'")
        child = _value(text, _skip(text, colon + 1), depth + 1)
        span.repeated_keys = span.repeated_keys or key in members
        members[key] = (position, key_end, child)
        return child.end

    span.end = _elements(text, start, "}", member)
    return span


def _array(text: str, start: int, depth: int) -> Span:
    items: list[Span] = []

    def item(position: int) -> int:
        child = _value(text, position, depth + 1)
        items.append(child)
        return child.end

    return Span(start, _elements(text, start, "]", item), items=items)


def _elements(text: str, start: int, closer: str, element: Callable[[int], int]) -> int:
    """Reads each element of the container opening at ``start`` with ``element`` (which
    returns where the element ends); returns where the container ends."""
    position = _skip(text, start + 1)
    if text[position] == closer:
        return position + 1
    while True:
        position = _skip(text, element(position))
        if text[position] == closer:
            return position + 1
        if text[position] != ",":
            raise ValueError(f"expected ',' or {closer!r}")
        position = _skip(text, position + 1)


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
    """``text``, which reads as ``old``, changed to read as ``new``.

    Every value equal in both keeps its exact text, whitespace around it included; an
    object whose keys did not change keeps its key order and layout.
    """
    span = read(text)
    return dumps(new) if span is None else _render(text, span, old, new)


def _render(text: str, span: Span, old: Any, new: Any) -> str:
    if same(old, new):
        return text[span.start : span.end]
    if span.members is not None and isinstance(old, dict) and isinstance(new, dict):
        if old.keys() == new.keys() and not span.repeated_keys:
            return _splice(
                text,
                span,
                [(child, old[key], new[key]) for key, (_, _, child) in span.members.items()],
            )
        members = []
        for key, value in new.items():
            if key in span.members and key in old:
                key_start, key_end, child = span.members[key]
                members.append(f"{text[key_start:key_end]}:{_render(text, child, old[key], value)}")
            else:
                members.append(f"{dumps(key)}:{dumps(value)}")
        return "{" + ",".join(members) + "}"
    if span.items is not None and isinstance(new, list):
        if isinstance(old, list) and len(old) == len(new) == len(span.items):
            return _splice(text, span, list(zip(span.items, old, new, strict=True)))
        kept = min(len(span.items), len(old)) if isinstance(old, list) else 0
        items = [
            _render(text, span.items[index], old[index], value) if index < kept else dumps(value)
            for index, value in enumerate(new)
        ]
        return "[" + ",".join(items) + "]"
    return dumps(new)


def _splice(text: str, span: Span, children: list[tuple[Span, Any, Any]]) -> str:
    """The container's own text with each child rendered in its place."""
    pieces = []
    position = span.start
    for child, old, new in sorted(children, key=lambda entry: entry[0].start):
        pieces.append(text[position : child.start])
        pieces.append(_render(text, child, old, new))
        position = child.end
    pieces.append(text[position : span.end])
    return "".join(pieces)
