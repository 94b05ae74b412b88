"""The shape the model's answer is held to: the ``response_format`` sent, and the form to
fall back to when an endpoint refuses one.

Three forms, best first:

- ``json_schema``: OpenAI's structured outputs, which llama.cpp's own server and vLLM take
  too: the answer's schema, ``corrected_payload`` constrained by the tool's schema.
- ``json_object_schema``: ``{"type": "json_object", "schema": ...}``, the form
  llama-cpp-python's server reads (it refuses ``json_schema``): the same schema.
- ``json_object``: JSON mode alone, which every OpenAI-compatible server takes.

An endpoint that refuses a form (an error answer naming ``response_format``, the schema or
the grammar it compiles the schema to, as OpenAI, llama.cpp and llama-cpp-python word it)
is not asked for it again for ``REFUSAL_HOLD_S``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, cast

from sidecar.repair.llm_answer import MAX_GROWTH

if TYPE_CHECKING:
    import openai
    from openai.types.chat.completion_create_params import ResponseFormat

FORMS = ("json_schema", "json_object_schema", "json_object")
# What a 400 refusing a form names: the field, the schema, or the grammar it became.
_NAMES_FORM = re.compile(r"response_format|schema|grammar", re.IGNORECASE)
# Where pydantic locates an error in the request llama-cpp-python's server refused.
_AT_RESPONSE_FORMAT = re.compile(r"\(\s*'body',\s*'response_format'")
ANSWER_NAME = "payload_repair"


def answer_schema(
    tool_schema: dict[str, Any] | None, secret_names: Collection[str]
) -> dict[str, Any]:
    """The answer's JSON Schema, keys in the order the model must write them.

    ``corrected_payload`` follows the tool's schema, with the fields that hold a secret
    left free: there the model writes a placeholder, which the tool's rules for the real
    value (a pattern, a format) would not let it write.
    """
    payload: dict[str, Any] = (
        _loosened(tool_schema, frozenset(secret_names))
        if tool_schema is not None
        else {"type": "object"}
    )
    return {
        "type": "object",
        "properties": {
            "analysis": {"type": "string"},
            "corrected_payload": {"anyOf": [payload, {"type": "null"}]},
            "is_transient": {"type": "boolean"},
            "can_fix": {"type": "boolean"},
        },
        "required": ["analysis", "corrected_payload", "is_transient", "can_fix"],
        "additionalProperties": False,
    }


# The answer's words besides its payload: the keys, ``analysis``'s sentence or two, the flags.
_ANSWER_TOKENS_BESIDES_PAYLOAD = 256
# A JSON token is 3 bytes or more in the tokenizers of the models in use (GPT-4o's o200k,
# Qwen2.5's, Llama 3's): counted at 3, a payload's bytes overestimate its tokens.
_BYTES_PER_TOKEN = 3


def answer_tokens(payload_bytes: int, most: int) -> int:
    """The ``max_tokens`` of an answer whose payload is ``payload_bytes`` long: room for the
    largest ``corrected_payload`` the size guard takes (``MAX_GROWTH`` times the original)
    and the rest of the answer, at most ``most`` (``SIDECAR_LLM_MAX_ANSWER_TOKENS``)."""
    payload_tokens = -(-MAX_GROWTH * payload_bytes // _BYTES_PER_TOKEN)
    return min(most, _ANSWER_TOKENS_BESIDES_PAYLOAD + payload_tokens)


def response_format(form: str, schema: dict[str, Any]) -> ResponseFormat:
    """The ``response_format`` of a chat completion in ``form``."""
    if form == "json_schema":
        # ``strict`` is left off: a tool's schema seldom fits OpenAI's strict subset (every
        # property required, no open object), and OpenAI refuses such a schema under it.
        return {"type": "json_schema", "json_schema": {"name": ANSWER_NAME, "schema": schema}}
    if form == "json_object_schema":
        # Not in the openai package's types: the extra key is what llama-cpp-python reads.
        return cast("ResponseFormat", {"type": "json_object", "schema": schema})
    return {"type": "json_object"}


def refuses_format(error: openai.APIStatusError) -> bool:
    """Whether the endpoint refused the ``response_format`` asked for, rather than the call.

    OpenAI answers 400 with ``param`` ``response_format`` (``Invalid parameter:
    'response_format' of type 'json_schema' is not supported with this model``, ``Unknown
    parameter: 'response_format.schema'``); llama-cpp-python's server a 500 whose message is
    pydantic's error at ``('body', 'response_format', 'type')``. llama.cpp's server compiles
    the schema to a grammar, and a schema or template it cannot do that for is a 400 that
    names the schema or the grammar, not the field (``Either "json_schema" or "grammar" can
    be specified, but not both``; ``Failed to initialize samplers: Unexpected empty grammar
    stack after accepting piece: <think>``). Any other 500 is the call's error, whatever it
    names: a server that crashed once must not cost every later call its form.
    """
    said = f"{error.message} {_own_message(error.body)} {error.body}"
    if error.status_code == 500:
        return _AT_RESPONSE_FORMAT.search(said) is not None
    return error.status_code in (400, 422) and _NAMES_FORM.search(said) is not None


def _own_message(body: object) -> str:
    """The endpoint's error message as it wrote it: older releases of the openai package
    (1.40 among them) quote it only inside a ``repr``, where ``'body'`` reads
    ``\\'body\\'``."""
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) else ""


# How long a refused form is not asked for. A refusal may be passing (a gateway that
# restarted on another model, a template fixed): asked again after this, a form the endpoint
# still refuses costs one extra round trip per period, a form it takes again is used again.
REFUSAL_HOLD_S = 600.0


class ResponseFormats:
    """The forms one endpoint takes, best first: a form it refused is not asked for again
    until ``REFUSAL_HOLD_S`` have passed."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._refused_until: dict[str, float] = {}

    @property
    def current(self) -> str:
        now = self._clock()
        return next(form for form in FORMS if self._refused_until.get(form, now) <= now)

    def refused(self, form: str) -> bool:
        """Remember that ``form`` was refused; whether a form is left to fall back to."""
        if form == FORMS[-1]:
            return False  # JSON mode is the floor: a refusal of it is the call's error
        self._refused_until[form] = self._clock() + REFUSAL_HOLD_S
        return True


def _loosened(schema: Any, names: frozenset[str]) -> Any:
    """``schema`` with any property named in ``names``, at any depth, free of rules."""
    if isinstance(schema, list):
        return [_loosened(item, names) for item in schema]
    if not isinstance(schema, dict) or not names:
        return schema
    loosened = {key: _loosened(value, names) for key, value in schema.items()}
    properties = schema.get("properties")
    if isinstance(properties, dict):
        loosened["properties"] = {
            name: {} if name in names else _loosened(value, names)
            for name, value in properties.items()
        }
    return loosened
