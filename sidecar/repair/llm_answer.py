"""The model's answer and its guardrails: what it must be before a payload is sent.

An answer is refused unless ``corrected_payload`` is a JSON object that is new, fits the
schema and is at most four times the original's size. Each refusal says exactly what was
wrong, in words the model can be told when it is asked again.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import orjson

from sidecar.repair.coercion import coerce
from sidecar.repair.jsontext import dumps
from sidecar.repair.llm_prompt import LlmRequest
from sidecar.repair.payload import fingerprint
from sidecar.repair.redact import PutBackTooLarge, Redactor
from sidecar.tool.json_value import MAX_DEPTH, nests_within

MAX_GROWTH = 4
_SHOWN_SCHEMA_ERRORS = 3
_MAX_SCHEMA_MESSAGE = 200


@dataclass(frozen=True, slots=True)
class LlmAnswer:
    can_fix: bool
    is_transient: bool
    corrected: dict[str, Any] | None

    def to_json(self) -> bytes:
        fields = {"can_fix": self.can_fix, "is_transient": self.is_transient}
        return dumps({**fields, "corrected": self.corrected}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LlmAnswer:
        document = json.loads(data)  # integers of any size, as ``to_json`` wrote them
        return cls(document["can_fix"], document["is_transient"], document["corrected"])

    def restored(self, redactor: Redactor) -> LlmAnswer:
        """This answer with the secrets ``redactor`` hid put back (``Refused`` when that
        would grow it past the size guard)."""
        if self.corrected is None:
            return self
        return LlmAnswer(self.can_fix, self.is_transient, _put_back(redactor, self.corrected))


class Refused(Exception):
    """The model's answer broke a guardrail.

    ``kind`` names the guardrail (a metric label); the message says exactly what was wrong,
    in words the model is told when it is asked again.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _too_large() -> Refused:
    return Refused(
        "too_large", "corrected_payload is more than four times larger than the original"
    )


@dataclass(frozen=True, slots=True)
class Checked:
    """One reply of the model, read and checked against its request."""

    answer: LlmAnswer | None  # with secrets restored; usable only when nothing refused it
    written: dict[str, Any] | None  # ``corrected_payload`` as the model wrote it
    refused: Refused | None
    unreadable: bool  # refused before it could be read as an answer at all


def check(content: str, redactor: Redactor, request: LlmRequest) -> Checked:
    """The model's reply ``content`` read as an answer to ``request``, and every guard run."""
    try:
        answer, written = _parse(content, redactor)
        answer, written = _typed(answer, written, request.schema)
    except Refused as refused:
        return Checked(None, None, refused, unreadable=True)
    return Checked(answer, written, refusal(answer, written, request), unreadable=False)


def refusal(
    answer: LlmAnswer, written: dict[str, Any] | None, request: LlmRequest
) -> Refused | None:
    """Why ``answer`` may not be used for ``request``, or ``None``: a decline always may."""
    if not answer.can_fix or answer.corrected is None:
        return None
    try:
        check_correction(
            answer.corrected, request.payload, request.tried, request.schema, written=written
        )
    except Refused as refused:
        return refused
    return None


def _parse(content: str, redactor: Redactor) -> tuple[LlmAnswer, dict[str, Any] | None]:
    """The answer with secrets restored, and its ``corrected_payload`` as the model wrote it."""
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise Refused("not_json", "your answer is not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("can_fix"), bool):
        raise Refused(
            "not_answer",
            'your answer is not one JSON object with "can_fix" set to true or false',
        )
    corrected = document.get("corrected_payload")
    if document["can_fix"] and not isinstance(corrected, dict):
        raise Refused("not_object", "corrected_payload is not a JSON object")
    written = corrected if isinstance(corrected, dict) else None
    if written is not None and not nests_within(written, MAX_DEPTH):
        raise Refused("too_deep", f"corrected_payload nests deeper than {MAX_DEPTH} levels")
    answer = LlmAnswer(
        can_fix=document["can_fix"],
        is_transient=document.get("is_transient") is True,
        corrected=_put_back(redactor, written) if written is not None else None,
    )
    return answer, written


def _put_back(redactor: Redactor, written: dict[str, Any]) -> dict[str, Any]:
    try:
        restored: dict[str, Any] = redactor.restore(written)
    except PutBackTooLarge:
        raise _too_large() from None
    return restored


def _typed(
    answer: LlmAnswer, written: dict[str, Any] | None, schema: dict[str, Any] | None
) -> tuple[LlmAnswer, dict[str, Any] | None]:
    """The model's correction with the schema's exact type conversions made, as the agent's
    payload gets them: a small model often writes a right number as a string."""
    if schema is None or answer.corrected is None or written is None:
        return answer, written
    corrected, changed = coerce(answer.corrected, schema)
    if not changed:
        return answer, written
    return replace(answer, corrected=corrected), coerce(written, schema)[0]


def check_correction(
    corrected: dict[str, Any],
    original: dict[str, Any],
    tried: Collection[str],
    schema: dict[str, Any] | None,
    *,
    written: dict[str, Any] | None = None,
) -> None:
    """Raise ``Refused`` unless the correction is new, fits the schema and is not bloated.

    ``written`` is the correction as the model wrote it, secrets still placeholders: a
    schema refusal quotes values from it only, so its words can go back to the model.
    """
    if fingerprint(corrected) in tried:
        raise Refused(
            "tried",
            "corrected_payload is a payload already tried, and the tool refused it: "
            "propose a different one, or set can_fix to false",
        )
    # Measured as the text sent: a coerced integer may be past 64 bits, which orjson refuses.
    if len(dumps(corrected).encode()) > MAX_GROWTH * max(len(dumps(original).encode()), 1):
        raise _too_large()
    if schema:
        problems = _schema_errors(corrected, written if written is not None else corrected, schema)
        if problems:
            raise Refused("schema", "corrected_payload does not fit the schema: " + problems)


def _schema_errors(value: dict[str, Any], shown: dict[str, Any], schema: dict[str, Any]) -> str:
    """Where and why ``value`` fails ``schema`` ("" when it fits), worded from ``shown``.

    A message that would need a value ``shown`` does not hold (a secret, restored) names
    the path and the rule only.
    """
    import jsonschema  # only a model's proposal is ever validated

    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        validator = validator_class(schema)
        errors = list(validator.iter_errors(value))[:_SHOWN_SCHEMA_ERRORS]
        if not errors:
            return ""
        worded = {
            (error.json_path, error.validator): error.message
            for error in validator.iter_errors(shown)
        }
    except jsonschema.SchemaError:
        return ""  # a schema the validator cannot read checks nothing
    problems = []
    for error in errors:
        message = worded.get((error.json_path, error.validator), f"fails {error.validator!r}")
        if len(message) > _MAX_SCHEMA_MESSAGE:
            message = message[:_MAX_SCHEMA_MESSAGE] + "…"
        problems.append(f"{error.json_path}: {message}")
    return "; ".join(problems)
