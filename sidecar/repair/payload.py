"""A request body as the repair layers see it: bytes, and the JSON value they hold."""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import TYPE_CHECKING, Any

import orjson

from sidecar.repair.jsontext import dumps, rewrite
from sidecar.tool.json_value import parse_json

if TYPE_CHECKING:
    from sidecar.repair.llm_prompt import Conversation


class Payload:
    """A body that was or will be sent; ``layers`` says which repairs made it, and
    ``conversation`` what the model was told and answered when it wrote it.

    The JSON is parsed only when a repair layer asks for it: most calls never need it.
    """

    def __init__(
        self,
        body: bytes,
        layers: tuple[str, ...] = (),
        conversation: Conversation | None = None,
    ) -> None:
        self.body = body
        self.layers = layers
        self.conversation = conversation

    @cached_property
    def value(self) -> Any:
        """The body's JSON value (an integer past 64 bits reads as a float), or ``None`` when
        it is not JSON or nests too deep (``json_value``): then no layer repairs it."""
        return parse_json(self.body)

    @property
    def document(self) -> dict[str, Any] | None:
        """The body's JSON object, or ``None`` when the body is not one."""
        return self.value if isinstance(self.value, dict) else None

    def repaired(self, value: Any, layer: str, conversation: Conversation | None = None) -> Payload:
        """This payload changed to read as ``value``: only the values that differ are
        rewritten, every other byte of the body stays as the agent sent it. The model's
        conversation goes on with it, through the layers that change it after."""
        layers = self.layers if layer in self.layers else (*self.layers, layer)
        conversation = conversation or self.conversation
        if self.value is None:
            return Payload(dumps(value).encode(), layers, conversation)
        body = rewrite(self.body.decode(), self.value, value).encode()
        return Payload(body, layers, conversation)

    @cached_property
    def fingerprint(self) -> str:
        """Equal for payloads that mean the same JSON, whatever their key order."""
        if self.value is None:
            return hashlib.sha256(self.body).hexdigest()
        return fingerprint(self.value)


def fingerprint(document: Any) -> str:
    try:
        canonical = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers past 64 bits
        canonical = repr(document).encode()
    return hashlib.sha256(canonical).hexdigest()
