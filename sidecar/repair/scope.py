"""What a model's proposal may change: the fields the tool's answer names, and what it means
by them; nothing else.

The tool's words reach the model's prompt, and the model's answer reaches the tool: a tool
that echoes an instruction, and a model that obeys it, must not move a value the tool never
complained about, add a privilege or carry a secret to another field. So a proposal is read
like a code review, against the payload it corrects:

- a field may change, or be removed, only when the tool named it or a field holding it;
- a field may be added only when the tool named it and the schema, when known, allows it;
- a sibling of a named field (in the same object) may change when it carries the same
  defect and the same lossless conversion fixes it: a number sent as a string
  (``"13.405"`` → ``13.405``), a boolean spelled out (``"no"`` → ``false``). A validator
  that stops at its first error names one field of several (Go's ``encoding/json``, Joi,
  connexion, ajv without ``allErrors``);
- a field the tool did not name may be renamed to one it named: removed, its value, as it
  was, in the named field the payload lacked (``checkin_date`` → ``check_in`` for "CheckIn
  is required");
- an array's element counts as its array's field (``items.3.name`` is ``items.name``);
- a secret stays where it was, as it was: its placeholder is never changed, removed, copied
  or moved.

A field is named as the tool spells it: ``CheckIn``, ``check_in`` and ``checkIn`` are one
field. The tool names a field in its structure first: a FastAPI/pydantic ``loc``, an
envelope's ``details.field`` (``param``, ``parameter``, ``property``, ``path``), a detail
keyed by a payload or schema field (``suggested_``/``expected_`` ones too), MIRA's
``parameter_adjustments``, the field a validator's error structure names
(``tool.validation.field_references``: error lists with their ``path`` or ``pointer``,
celebrate's ``keys``, Rails's and go-playground/validator's messages by field, the field
Go's, Echo's and pydantic's messages spell out), and the field its error's code names
(``SYMBOL_NOT_FOUND`` names ``symbol``). Only when it names none that way do its words
count: a "missing field" phrase, a field quoted or made the subject of a rule, a value sent
quoted back. Echoed text can name a field in words; it cannot widen a scope the tool's
structure set. When the tool names no field at all, a proposal may change the values of the
fields the payload has, and add or remove none (docs/repair.md says why).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.repair.llm_answer import Refused
from sidecar.repair.llm_focus import FIELD_DETAILS, leaves, mentioned, missing, words_of
from sidecar.repair.llm_prompt import LlmRequest
from sidecar.repair.redact import Redactor
from sidecar.tool.envelopes import TEXT_SAMPLE_BYTES, ToolFailure
from sidecar.tool.json_value import parse_json
from sidecar.tool.validation import body_fields, field_key

Path = tuple[str, ...]  # object keys only: an array's index is not part of a field's name

_PREFIXES = ("suggested_", "expected_")
_PLACEHOLDER = re.compile(r"<redacted-\d+>")
# A name in quotes, as tools write the field they want: "the field is named 'postal_code'".
_QUOTED_NAME = re.compile(r"['\"`]([A-Za-z_][\w.]*)['\"`]")
_ERROR_FIELD_KEYS = (*FIELD_DETAILS, "name", "pointer", "loc")


OUT_OF_SCOPE = Refused(
    "out_of_scope", "corrected_payload changes fields the tool did not name as wrong"
)


@dataclass(frozen=True, slots=True)
class Scope:
    """One request's scope: the payload as the model saw it, and the fields the tool named."""

    shown: dict[str, Any]
    named: frozenset[Path]
    schema: dict[str, Any] | None
    redactor: Redactor  # a name the tool gave is the tool's words: redacted when told back

    @classmethod
    def of(cls, request: LlmRequest, redactor: Redactor) -> Scope:
        shown = redactor.redact(request.payload)
        named = named_fields(request.failure, request.body_text, shown, request.schema, redactor)
        return cls(shown, named, request.schema, redactor)

    def outside(self, written: dict[str, Any] | None) -> tuple[str, ...]:
        """The fields the model's ``corrected_payload`` touched out of scope."""
        if written is None:
            return ()
        return tuple(out_of_scope(self.shown, written, self.named, self.schema))

    def refusal(self, outside: tuple[str, ...]) -> Refused:
        """What the model is told when its answer touched ``outside``: those fields, and
        what it may change instead."""
        may = ", ".join(sorted(self.redactor.redact_text(".".join(path)) for path in self.named))
        allowed = f"change only {may}" if may else "change only values, add or remove none"
        return Refused(
            OUT_OF_SCOPE.kind,
            f"corrected_payload changes {', '.join(outside)}, which the tool did not name as "
            f"wrong; {allowed}, and keep every other field as it was",
        )


def named_fields(
    failure: ToolFailure | None,
    body_text: str,
    payload: dict[str, Any],
    schema: dict[str, Any] | None,
    redactor: Redactor,
) -> frozenset[Path]:
    """The fields the tool's answer names, by its structure when it has one, else by its
    words. ``payload`` is the one the model was shown (redacted)."""
    # A root reference ("$", "#", "/") names the whole body, which is no field.
    structured = frozenset(filter(None, _structured(failure, body_text, payload, schema)))
    if structured:
        return structured
    words = redactor.redact_text(_said(failure, body_text)[:TEXT_SAMPLE_BYTES])
    fields = [*leaves(payload), *_schema_fields(schema)]
    sent = {value for _, value in fields if isinstance(value, str)}
    # A name in quotes is a field to add, unless it is a value sent, quoted back.
    quoted = [name for name in _QUOTED_NAME.findall(words) if name not in sent]
    said = (*missing(words), *mentioned(words, fields), *quoted)
    return frozenset(path for path in map(_path, said) if path)


def _said(failure: ToolFailure | None, body_text: str) -> str:
    """What the tool says, for its words to name fields by: its message and its details
    (each by its key), or the strings of a JSON body. The keys of a JSON body or of a
    detail's value (``detail``, ``loc``, an echoed input's) and the quotes of a JSON string
    are the tool's structure, neither a field it names nor a name it quotes."""
    if failure is None:
        document = parse_json(body_text)
        if not isinstance(document, dict | list):
            return words_of(None, body_text)
        return "; ".join(_strings(document))
    parts = [failure.message]
    size = len(failure.message)
    for key, value in failure.details.items():
        if size > TEXT_SAMPLE_BYTES:
            break
        parts.append(f"{key}: {'; '.join(_strings(value))}")
        size += len(parts[-1])
    return "; ".join(part for part in parts if part)


def _strings(value: Any) -> Iterator[str]:
    """The strings ``value`` holds, however deep, whitespace collapsed."""
    if isinstance(value, str):
        yield " ".join(value.split())
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def out_of_scope(
    original: dict[str, Any],
    proposed: dict[str, Any],
    named: frozenset[Path],
    schema: dict[str, Any] | None,
) -> list[str]:
    """The dotted names of the fields ``proposed`` changes, adds or removes outside the
    tool's ``named`` fields, and of those a secret was changed, removed, copied or moved
    at; empty when the proposal keeps to its scope. Both payloads as the model saw and
    wrote them: secrets as placeholders."""
    spelled = frozenset(map(_spelling, named))
    own, written = _placeholders(original), _placeholders(proposed)
    diffs = list(differences(original, proposed))
    renamed = _renames(diffs, original, proposed, spelled, schema)
    outside: dict[str, None] = {}
    for kind, path in diffs:
        if path in renamed or _allowed(kind, path, spelled, schema):
            continue
        if kind == "changed" and _same_defect(path, original, proposed, spelled):
            continue
        outside[".".join(path)] = None
    for exact, held in own.items():  # a secret stays where it was, as it was
        if not held <= written.get(exact, frozenset()):
            outside[".".join(_field(exact))] = None
    for exact, found in written.items():  # ... and goes nowhere else
        if found - own.get(exact, frozenset()):
            outside[".".join(_field(exact))] = None
    return list(outside)


def differences(before: Any, after: Any, path: Path = ()) -> Iterator[tuple[str, Path]]:
    """Each ``changed``, ``added`` or ``removed`` field of ``after`` against ``before``."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            if key not in after:
                yield "removed", (*path, key)
            else:
                yield from differences(before[key], after[key], (*path, key))
        for key in after:
            if key not in before:
                yield "added", (*path, key)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for item_before, item_after in zip(before, after, strict=True):
            yield from differences(item_before, item_after, path)
    elif not _same(before, after):
        yield "changed", path


def _allowed(kind: str, path: Path, named: frozenset[Path], schema: dict[str, Any] | None) -> bool:
    if not named:
        return kind == "changed"  # the tool named nothing: values only, no field in or out
    # The field itself, one inside a field it named, or one holding a field it named (a
    # value reshaped: ``"1,2"`` become ``{"lat": 1, "lon": 2}`` for ``position.lat``).
    spelled = _spelling(path)
    inside = any(
        spelled[: len(field)] == field or field[: len(spelled)] == spelled for field in named
    )
    if kind == "added":
        return inside and _schema_allows(schema, path)
    return inside


def _spelling(path: Path) -> Path:
    """A path as names compare: ``CheckIn``, ``check_in`` and ``checkIn`` are one field."""
    return tuple(map(field_key, path))


# The defects a lossless conversion fixes, by what the value becomes.
# Digits are a number's text, not a boolean's.
_SPELLED_BOOLEANS = {"true": True, "false": False, "yes": True, "no": False}
_SPELLED_BOOLEANS |= {"y": True, "n": False, "on": True, "off": False}


def _defect(before: Any, after: Any) -> str | None:
    """The defect a change fixes losslessly, if it is one: a number or a boolean sent as
    text, the text meaning exactly the value written."""
    if not isinstance(before, str):
        return None
    text = before.strip().casefold()
    if isinstance(after, bool):
        return "boolean_as_text" if _SPELLED_BOOLEANS.get(text) is after else None
    if isinstance(after, int | float):
        try:
            return "number_as_text" if float(text) == after else None
        except ValueError:
            return None
    return None


def _carries(value: Any, defect: str) -> bool:
    """Whether ``value`` as sent has ``defect``."""
    if not isinstance(value, str):
        return False
    text = value.strip().casefold()
    if defect == "boolean_as_text":
        return text in _SPELLED_BOOLEANS
    try:
        float(text)
    except ValueError:
        return False
    return True


def _same_defect(
    path: Path, original: dict[str, Any], proposed: dict[str, Any], named: frozenset[Path]
) -> bool:
    """Whether the change at ``path`` fixes, losslessly, the defect a named sibling (a field
    of the same object) was sent with."""
    defect = _defect(_value_at(original, path), _value_at(proposed, path))
    if defect is None:
        return False
    holder = _value_at(original, path[:-1]) if len(path) > 1 else original
    if not isinstance(holder, dict):
        return False
    parent = _spelling(path[:-1])
    return any(
        _carries(value, defect)
        for key, value in holder.items()
        if (*parent, field_key(key)) in named and field_key(key) != field_key(path[-1])
    )


def _renames(
    diffs: list[tuple[str, Path]],
    original: dict[str, Any],
    proposed: dict[str, Any],
    named: frozenset[Path],
    schema: dict[str, Any] | None,
) -> frozenset[Path]:
    """The fields removed only to go, as they were, into a named field the payload lacked:
    the agent's ``checkin_date`` for the tool's ``check_in``."""
    added = {
        path: _value_at(proposed, path)
        for kind, path in diffs
        if kind == "added" and _allowed(kind, path, named, schema)
    }
    renamed = {
        path
        for kind, path in diffs
        if kind == "removed"
        and any(
            target[:-1] == path[:-1] and _same(_value_at(original, path), value)
            for target, value in added.items()
        )
    }
    return frozenset(renamed)


def _value_at(document: Any, path: Path) -> Any:
    """The value at ``path`` (object keys only; an array's first element stands for all)."""
    for key in path:
        while isinstance(document, list) and document:
            document = document[0]
        if not isinstance(document, dict) or key not in document:
            return None
        document = document[key]
    return document


def _same(before: Any, after: Any) -> bool:
    """Equal as JSON: ``true`` is not ``1``, ``1`` is ``1.0``."""
    if isinstance(before, bool) or isinstance(after, bool):
        return before is after
    if isinstance(before, int | float) and isinstance(after, int | float):
        return before == after
    return type(before) is type(after) and bool(before == after)


def _schema_allows(schema: Any, path: Path) -> bool:
    """Whether ``schema`` lets an object hold ``path`` (no schema allows everything)."""
    for key in path:
        if not isinstance(schema, Mapping):
            return True
        if isinstance(schema.get("items"), Mapping) and "properties" not in schema:
            schema = schema["items"]
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and key in properties:
            schema = properties[key]
        elif schema.get("additionalProperties") is False:
            return False
        else:
            schema = schema.get("additionalProperties")
    return True


def _placeholders(value: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], frozenset[str]]:
    """Each exact path (array indices included) holding a placeholder, and those it holds."""
    found: dict[tuple[str, ...], frozenset[str]] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            found.update(_placeholders(item, (*path, str(key))))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.update(_placeholders(item, (*path, str(index))))
    elif isinstance(value, str) and "<redacted-" in value:
        found[path] = frozenset(_PLACEHOLDER.findall(value))
    return found


def _field(exact: tuple[str, ...]) -> Path:
    """An exact path as the field it is in: array indices dropped."""
    return tuple(part for part in exact if not part.isdigit())


def _structured(
    failure: ToolFailure | None,
    body_text: str,
    payload: dict[str, Any],
    schema: dict[str, Any] | None,
) -> Iterator[Path]:
    """The fields the tool's answer names in its structure."""
    message = failure.message if failure is not None else ""
    yield from body_fields(body_text, message, payload)
    if failure is None:
        return
    fields = [*leaves(payload), *_schema_fields(schema)]
    known = {path for path, _ in fields}
    for key, value in failure.details.items():
        if key in FIELD_DETAILS and isinstance(value, str) and value:
            yield _path(value)
        field = next((key.removeprefix(p) for p in _PREFIXES if key.startswith(p)), key)
        if field in known:
            yield _path(field)
        if isinstance(value, list):
            yield from _error_fields(value)
    for name in failure.parameter_adjustments:
        yield _path(name)
    yield from _named_by_code(failure.code, (path for path, _ in fields if "." not in path))


# Words of an error code that name no field of their own.
_NOT_A_FIELD = frozenset(
    {"invalid", "error", "not", "found", "missing", "required", "bad", "request", "value"}
    | {"unknown", "failed", "validation", "input", "field", "param", "parameter", "format"}
)


def _named_by_code(code: str, names: Iterable[str]) -> Iterator[Path]:
    """The fields an error's code names by its words: ``SYMBOL_NOT_FOUND`` names ``symbol``,
    ``INVALID_CURRENCY_CODE`` ``currency_code`` (or ``currency``)."""
    words = [word for word in re.split(r"[^0-9a-z]+", code.casefold()) if word]
    runs = {"".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, i + 4)}
    runs -= _NOT_A_FIELD
    for name in names:
        if field_key(name) in runs:
            yield (name,)


def _error_fields(errors: list[Any]) -> Iterator[Path]:
    """The fields a list of errors names, one per error (RFC 9457's ``pointer``, ``name``)."""
    for error in errors:
        if not isinstance(error, Mapping):
            continue
        where = next((error[key] for key in _ERROR_FIELD_KEYS if key in error), None)
        if isinstance(where, str | list) and where:
            yield _path(where)


def _schema_fields(schema: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The top-level properties of ``schema``, as fields holding nothing yet."""
    properties = schema.get("properties") if schema else None
    if not isinstance(properties, Mapping):
        return []
    return [(str(name), None) for name in properties]


def _path(where: Any) -> Path:
    """A field's place, from a pydantic ``loc``, a dotted name, a JSON pointer or path."""
    if isinstance(where, list):
        # FastAPI puts "body" first; a field named "body" is one further in.
        parts = [str(part) for part in where[where[:1] == ["body"] :] if not isinstance(part, int)]
    else:
        text = str(where).removeprefix("#").removeprefix("$").removeprefix("body.")
        parts = re.split(r"[./\[\]]", text)
    return tuple(part for part in parts if part and not part.isdigit())
