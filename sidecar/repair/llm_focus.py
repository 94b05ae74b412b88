"""What the model reads first: each field the tool refused, what the payload held there, and
the tool's own words about it.

A small model that is handed the whole answer and payload often fixes the wrong thing or
nothing; named up front, the field gets its attention. The field is found where the tool
put it: a FastAPI/pydantic ``loc``, Go's ``Go struct field T.name``, an envelope's
``details.field``, a "missing field" phrase, or a field (or the value sent in it) that
the message quotes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson

from sidecar.repair.redact import Redactor
from sidecar.tool.envelopes import TEXT_SAMPLE_BYTES, ToolFailure
from sidecar.tool.json_value import parse_json
from sidecar.tool.validation import body_fields, pydantic_errors

_MAX_FIELDS = 3
_MAX_WORDS = 600
FIELD_DETAILS = ("field", "param", "parameter", "property", "path")
_WORD = re.compile(r"\w+")
# Every run between two single quotes, overlapping: "it's 'Paris'" holds "Paris".
_QUOTED = re.compile(r"(?='([^']*)')")
_GO_UNMARSHAL = re.compile(
    r"json: cannot unmarshal (\w+) into Go (?:struct field ([\w.]+)|value) of type ([\w.\[\]*]+)"
)
_MISSING = (
    re.compile(r"(?i)missing (?:required )?(?:field|parameter|property|key)s?\W+(\w+)"),
    re.compile(r"(?i)(?:field|parameter|property|key) ['\"`]?(\w+)['\"`]? is (?:required|missing)"),
    re.compile(r"(?i)^['\"`]?(\w+)['\"`]? is (?:required|missing)"),
)
# A field the message speaks of: quoted, as the subject of a rule, or leading the message.
_NAMED_AS = (
    r"['\"`]{name}['\"`]"
    r"|(?<![\w.-]){name}(?=:|\s+(?:must|is|should|has|was)\b)"
    r"|^{name}\b"
)
# What Go's type names ask of the JSON value.
_GO_WANTS = (
    (re.compile(r"u?int\d*"), "a JSON integer, without quotes"),
    (re.compile(r"float\d+|json\.Number"), "a JSON number, without quotes"),
    (re.compile(r"bool"), "true or false, without quotes"),
    (re.compile(r"string"), "a JSON string"),
    (re.compile(r"\[\].*"), "a JSON array"),
)


def at_fault(
    failure: ToolFailure | None,
    body_text: str,
    payload: dict[str, Any],
    schema: dict[str, Any] | None,
    redactor: Redactor,
) -> list[dict[str, Any]]:
    """Each field the tool refused, as ``field``, ``sent`` (or ``missing_from_payload``),
    ``tool_says`` and, when known, ``tool_wants`` and its ``schema``; a single entry with
    ``tool_says`` alone when no field can be told. ``payload`` is already redacted."""
    errors = pydantic_errors(body_text) if failure is None else None
    if errors is not None:
        in_body = [error for error in errors if error["loc"][:1] == ["body"]] or errors
        hint = _extra_words(body_text)
        return [
            _entry(
                redactor.redact_text(".".join(str(part) for part in _without_body(error["loc"]))),
                redactor.redact_text(str(error.get("msg", "")) + hint),
                payload,
                schema,
            )
            for error in in_body[:_MAX_FIELDS]
        ]
    # Cut once redacted: a secret the tool echoes across the cut is not shown in part.
    words = redactor.redact_text(words_of(failure, body_text))[:_MAX_WORDS]
    go = _GO_UNMARSHAL.search(words)
    if go is not None and go[2]:
        wants = next((said for kind, said in _GO_WANTS if kind.fullmatch(go[3])), None)
        entry = _entry(go[2].partition(".")[2], words, payload, schema)
        return [{**entry, "tool_wants": wants} if wants else entry]
    # A field the tool names is the tool's words too: redacted like them.
    named = (redactor.redact_text(field) for field in _named(failure, words, body_text, payload))
    fields = list(dict.fromkeys(named))[:_MAX_FIELDS]
    if not fields:
        return [{"tool_says": words}]
    return [_entry(field, words, payload, schema) for field in fields]


def still_refused(fix: list[dict[str, Any]], answer: dict[str, Any] | None = None) -> str:
    """A sentence for each field at fault whose value the tool refused and the model must
    change: every one ``fix`` names a value for, or, with ``answer``, those it kept.

    Told only that the tool refused its payload, or that it proposed one already tried, a
    small model mostly answers the same again; named value by value, it looks again.
    """
    kept = [
        entry
        for entry in fix
        if "sent" in entry and (answer is None or _at(answer, entry["field"]) == entry["sent"])
    ]
    return " ".join(
        f"{orjson.dumps(entry['sent']).decode()} is not what the tool wants for {entry['field']}."
        for entry in kept
    )


def _entry(
    field: str, words: str, payload: dict[str, Any], schema: dict[str, Any] | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"field": field}
    sent = _at(payload, field)
    if sent is _ABSENT:
        entry["missing_from_payload"] = True
    else:
        entry["sent"] = sent
    entry["tool_says"] = words
    rule = _at(schema.get("properties", {}), field, through_properties=True) if schema else _ABSENT
    if isinstance(rule, dict) and set(rule) - {"type"}:
        entry["schema"] = rule
    return entry


def _without_body(location: list[Any]) -> list[Any]:
    """A pydantic ``loc`` as a path into the payload: FastAPI puts ``"body"`` first."""
    return location[1:] if location[:1] == ["body"] else location


def words_of(failure: ToolFailure | None, body_text: str) -> str:
    """The tool's words: its message and the hints its details give, or its body's text.

    Details are taken whole, in order, until the words pass ``TEXT_SAMPLE_BYTES``: 7,000 of
    them cost 1.4 s a request read whole, and no cut falls inside one (a secret it echoes
    is redacted whole, never shown in part)."""
    if failure is None:
        return " ".join(body_text.split())
    parts = [failure.message]
    size = len(failure.message)
    for key, value in failure.details.items():
        if size > TEXT_SAMPLE_BYTES:
            break
        said = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
        parts.append(f"{key}: {said}")
        size += len(parts[-1])
    return "; ".join(part for part in parts if part)


def _extra_words(body_text: str) -> str:
    """A FastAPI answer's words beside its ``detail`` list (a ``hint``), to follow each error."""
    document = parse_json(body_text)
    if not isinstance(document, dict):
        return ""
    extra = [f"{key}: {value}" for key, value in document.items() if isinstance(value, str)]
    return "; " + "; ".join(extra) if extra else ""


def _named(
    failure: ToolFailure | None, words: str, body_text: str, payload: dict[str, Any]
) -> Iterator[str]:
    """The fields the tool names, the surest first: its validator's structure, its
    envelope's details, then its words."""
    message = failure.message if failure is not None else ""
    yield from map(".".join, body_fields(body_text, message, payload))
    details: Mapping[str, Any] = failure.details if failure is not None else {}
    for key in FIELD_DETAILS:
        if isinstance(details.get(key), str) and details[key]:
            yield details[key].removeprefix("body.")
    yield from missing(words)
    yield from mentioned(words, leaves(payload))


def missing(words: str) -> Iterator[str]:
    """The fields a "missing field" phrase of ``words`` names."""
    for pattern in _MISSING:
        for found in pattern.finditer(words):
            yield found[1]


def mentioned(words: str, fields: Iterable[tuple[str, Any]]) -> Iterator[str]:
    """The dotted paths of ``fields`` (path, value sent) whose name ``words`` speaks of, or
    whose value it quotes back ("City 'Springfield, IL' not found").

    One pass over ``words`` collects its words and quoted strings; each field is then a set
    lookup, and only a name found there is matched against the forms of ``_NAMED_AS``: the
    cost is the words' length plus the fields', never their product.
    """
    tokens = set(_WORD.findall(words))
    quoted = set(_QUOTED.findall(words))
    named: dict[str, bool] = {}  # each name's regex once: a payload may hold many fields
    for path, value in fields:
        name = path.rpartition(".")[2]
        if name not in named:
            spoken = name in tokens if _WORD.fullmatch(name) else name in words
            named_as = _NAMED_AS.format(name=re.escape(name))
            named[name] = spoken and re.search(named_as, words) is not None
        if named[name] or (isinstance(value, str) and len(value) > 1 and value in quoted):
            yield path


def leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every field of a payload by its dotted path, the objects holding others included."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        path = f"{prefix}{key}"
        yield path, item
        yield from leaves(item, path + ".")


class _Absent:
    pass


_ABSENT = _Absent()


def _at(document: Any, dotted: str, *, through_properties: bool = False) -> Any:
    """The value at ``dotted`` in ``document`` (or in a schema's properties), else ``_ABSENT``.

    A number steps into an array, as pydantic's ``loc`` and the tools' ``items.3.name`` do.
    """
    for part in dotted.split(".") if dotted else ():
        index = int(part) if part.isascii() and part.isdigit() else None
        if through_properties and isinstance(document, dict):
            if index is not None and isinstance(document.get("items"), dict):
                document = document["items"]  # every element has the one schema
                continue
            document = document.get("properties", document)
        if isinstance(document, list) and index is not None and index < len(document):
            document = document[index]
        elif isinstance(document, dict) and part in document:
            document = document[part]
        else:
            return _ABSENT
    return document
