"""Reading JSON that comes from outside: an agent's payload, a tool's answer.

One bound for all of it. What the sidecar reads, it walks recursively (an envelope's
details, a payload's fields, a prompt, a schema check), and Python's stack ends near
1,000 frames; no tool's schema nests anywhere near ``MAX_DEPTH``. JSON nested deeper is
read as no JSON at all: it still crosses the wire as it came, and the status decides.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_DEPTH = 64


def parse_json(body: bytes | str) -> Any:
    """The JSON value of ``body``, or ``None`` when it is not JSON or nests deeper than
    ``MAX_DEPTH``."""
    try:
        value = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError):
        return None
    return value if nests_within(value, MAX_DEPTH) else None


def nests_within(value: Any, limit: int) -> bool:
    """Whether ``value`` holds objects and arrays no more than ``limit`` levels deep."""
    level = [value]
    for _ in range(limit + 1):
        level = [item for item in level if isinstance(item, dict | list)]
        if not level:
            return True
        level = [
            child for item in level for child in (item.values() if isinstance(item, dict) else item)
        ]
    return False
