"""A request body as the repair layers see it: bytes, and the JSON object they hold."""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Any

import orjson


class Payload:
    """A body that was or will be sent; ``layers`` says which repairs made it.

    The JSON is parsed only when a repair layer asks for it: most calls never need it.
    """

    def __init__(
        self, body: bytes, document: dict[str, Any] | None = None, layers: tuple[str, ...] = ()
    ) -> None:
        self.body = body
        self.layers = layers
        if document is not None:
            self.document = document

    @cached_property
    def document(self) -> dict[str, Any] | None:
        """The body's JSON object, or ``None`` when the body is not one."""
        if self.body.lstrip()[:1] != b"{":
            return None
        try:
            parsed = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def repaired(self, document: dict[str, Any], layer: str) -> Payload:
        layers = self.layers if layer in self.layers else (*self.layers, layer)
        return Payload(orjson.dumps(document), document, layers)

    @cached_property
    def fingerprint(self) -> str:
        """Equal for payloads that mean the same JSON, whatever their key order."""
        if self.document is None:
            return hashlib.sha256(self.body).hexdigest()
        return fingerprint(self.document)


def fingerprint(document: Any) -> str:
    try:
        canonical = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers past 64 bits
        canonical = repr(document).encode()
    return hashlib.sha256(canonical).hexdigest()
