"""A request body as the repair layers see it: bytes, and the JSON object they hold."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Payload:
    """A body that was or will be sent; ``layers`` says which repairs made it."""

    body: bytes
    document: dict[str, Any] | None
    layers: tuple[str, ...] = ()

    @classmethod
    def of(cls, body: bytes) -> Payload:
        """The agent's body; ``document`` is set only when it is a JSON object."""
        document = None
        if body.lstrip()[:1] == b"{":
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None
            document = parsed if isinstance(parsed, dict) else None
        return cls(body, document)

    def repaired(self, document: dict[str, Any], layer: str) -> Payload:
        layers = self.layers if layer in self.layers else (*self.layers, layer)
        return Payload(orjson.dumps(document), document, layers)

    @property
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
