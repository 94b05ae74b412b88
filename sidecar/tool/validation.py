"""Whether a 400/422 says the request body is invalid — something a new payload can fix —
and which of its fields the validator named.

Read in this order:

1. The fields a validator's error structure names (``field_references``), in the formats
   the common validators write: a FastAPI / pydantic ``{"detail": [{"type", "loc", "msg"},
   …]}`` list, error by error (a pydantic error of a type below makes the answer
   repairable); a list of errors each with its ``path``, ``pointer``, ``field``,
   ``param``, ``property`` or ``keys`` (Zod's issues, express-validator's, ajv's and
   express-openapi-validator's, RFC 9457 problem details' ``errors`` and RFC 7807's
   ``invalid-params``, Symfony's ``violations``); celebrate's ``validation`` by request
   part; a map of error messages by field (Rails, go-playground/validator's translations);
   and the field a message spells out (Go's ``encoding/json`` and go-playground/validator,
   Echo's bind errors, pydantic's text, express-openapi-validator's ``request/body/…``).
   Fields of the body make the answer repairable; when every field named lies outside the
   body (the query, the path, a header, a cookie), no payload can fix it.
2. Otherwise, a pydantic error type quoted anywhere in the text, or a phrase of one of those
   validators, JSON Schema validators, Rails, Spring or hand-written errors.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any

from sidecar.tool.json_value import parse_json


class Finding(enum.Enum):
    IN_BODY = "in_body"  # a changed payload can fix it
    OUTSIDE_BODY = "outside_body"  # only the query, path, headers or cookies are wrong
    NONE = "none"  # not a validation error this module knows


# pydantic v2 error types (pydantic_core's ErrorType) that a different JSON body can clear.
FIXABLE_TYPES = frozenset(
    {
        # missing, extra or malformed input
        "missing",
        "extra_forbidden",
        "json_invalid",
        "none_required",
        "union_tag_invalid",
        "union_tag_not_found",
        "value_error",
        "assertion_error",
        # the wrong JSON type, or text that does not parse as the wanted one
        "model_type",
        "model_attributes_type",
        "dataclass_type",
        "named_tuple_type",
        "dict_type",
        "frozen_dict_type",
        "ordered_dict_type",
        "mapping_type",
        "counter_type",
        "list_type",
        "tuple_type",
        "set_type",
        "frozen_set_type",
        "deque_type",
        "iterable_type",
        "set_item_not_hashable",
        "string_type",
        "string_unicode",
        "bytes_type",
        "bytes_invalid_encoding",
        "bool_type",
        "bool_parsing",
        "int_type",
        "int_parsing",
        "int_parsing_size",
        "int_from_float",
        "float_type",
        "float_parsing",
        "finite_number",
        "decimal_type",
        "decimal_parsing",
        "fraction_type",
        "fraction_parsing",
        "complex_type",
        "complex_str_parsing",
        "date_type",
        "date_parsing",
        "date_from_datetime_parsing",
        "date_from_datetime_inexact",
        "time_type",
        "time_parsing",
        "datetime_type",
        "datetime_parsing",
        "datetime_from_date_parsing",
        "time_delta_type",
        "time_delta_parsing",
        "timezone_naive",
        "timezone_aware",
        "timezone_offset",
        "url_type",
        "url_parsing",
        "url_syntax_violation",
        "url_too_long",
        "url_scheme",
        "uuid_type",
        "uuid_parsing",
        "uuid_version",
        # a value out of its allowed set or range
        "literal_error",
        "enum",
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "multiple_of",
        "too_short",
        "too_long",
        "string_too_short",
        "string_too_long",
        "string_pattern_mismatch",
        "string_not_ascii",
        "bytes_too_short",
        "bytes_too_long",
        "decimal_max_digits",
        "decimal_max_places",
        "decimal_whole_digits",
        "date_past",
        "date_future",
        "datetime_past",
        "datetime_future",
        # arguments of a @validate_call function fed from the body
        "arguments_type",
        "missing_argument",
        "unexpected_keyword_argument",
        "missing_keyword_only_argument",
        "unexpected_positional_argument",
        "missing_positional_only_argument",
        "multiple_argument_values",
    }
)

# The other pydantic v2 types, and why a new payload cannot clear them.
LEFT_OUT_TYPES = {
    "no_such_attribute": "setting an unknown attribute on a model in code",
    "json_type": "the tool passed a non-string to model_validate_json",
    "needs_python_object": "the schema needs a Python object, which JSON cannot carry",
    "recursion_loop": "a cyclic Python object",
    "recursion_depth_exceeded": "input nested past pydantic's limit; no repair reshapes it",
    "frozen_field": "assignment to a frozen field in code",
    "frozen_instance": "assignment to a frozen model in code",
    "invalid_key": "a non-string key, which JSON objects cannot have",
    "get_attribute_error": "an attribute getter raised in code (from_attributes)",
    "dataclass_exact_type": "strict mode wants a dataclass instance",
    "default_factory_not_called": "a default factory misused in code",
    "iteration_error": "a Python iterable raised while being read",
    "missing_sentinel_error": "wants the MISSING sentinel object",
    "ellipsis_error": "wants Python's Ellipsis",
    "datetime_object_invalid": "a broken datetime object",
    "is_instance_of": "wants an instance of a Python class",
    "is_subclass_of": "wants a Python class",
    "callable_type": "wants a Python callable",
}

_OUTSIDE_BODY = frozenset(
    {"query", "path", "params", "header", "headers", "cookie", "cookies", "querystring"}
)
# pydantic v1 (FastAPI before 0.100) names its types type_error.* and value_error.*.
_V1_TYPE = re.compile(r"(?:type|value)_error(?:\.[a-z_]+)*")

# Type and validation errors that a changed payload can fix: Go's encoding/json and
# go-playground/validator, pydantic and FastAPI, JSON Schema validators (Python's jsonschema,
# ajv), Zod, Joi, Rails, Spring and the common hand-written phrasings.
VALIDATION_ERROR = re.compile(
    r"cannot unmarshal|unmarshal type error|type mismatch|invalid type|wrong type"
    r"|must be (?:a|an|of type)\b|must be (?:greater|less|at least|at most|between|one of)"
    r"|must be (?:number|string|integer|boolean|object|array|null)\b|must be [<>]=?"
    r"|must match (?:format|pattern)|must have required propert|must not have additional"
    r"|must be equal to one of|is required|required field|missing required|field required"
    r"|failed on the '\w+' tag|is not valid under|is not of type|is not one of"
    r"|is a required property|is not a '|is (?:less|greater) than the (?:minimum|maximum)"
    r"|additional properties are not allowed|does not match '|should match pattern"
    r"|expected (?:a |an )?(?:string|number|integer|int|float|bool|boolean|object|array)"
    r"|invalid (?:value|format|option|input|email|iso|date|uuid|url)|unrecognized keys?\b"
    r"|too (?:small|big): expected|is not a number|is not included in the list"
    r"|can't be blank|failed to read request|invalid request content"
    r"|input should be|should have at (?:least|most)|extra inputs are not permitted"
    r"|validation errors? for \w+\n"
    r"|(?:\[type=|\"type\":\s*\")(?:(?:type|value)_error[a-z_.]*|"
    + "|".join(sorted(FIXABLE_TYPES, key=len, reverse=True))
    + r")[\",]",
    re.IGNORECASE,
)


def find(message: str, text: str) -> Finding:
    """What an error's envelope ``message`` and body ``text`` say about the payload."""
    errors = pydantic_errors(text)
    if errors is not None:
        in_body = [error for error in errors if _location(error) not in _OUTSIDE_BODY]
        if not in_body:
            return Finding.OUTSIDE_BODY
        return Finding.IN_BODY if any(map(_fixable, in_body)) else Finding.NONE
    references = field_references(text, message)
    if references:
        named_in_body = any(where not in _OUTSIDE_BODY for where, _ in references)
        return Finding.IN_BODY if named_in_body else Finding.OUTSIDE_BODY
    if VALIDATION_ERROR.search(message) or VALIDATION_ERROR.search(text):
        return Finding.IN_BODY
    return Finding.NONE


def pydantic_errors(text: str) -> list[dict[str, Any]] | None:
    """The errors of a FastAPI/pydantic ``detail`` list, or ``None`` when there is none."""
    if not text.lstrip().startswith("{"):
        return None
    # Not JSON, cut at the sample size, or nested too deep to walk: no list.
    document = parse_json(text)
    detail = document.get("detail") if isinstance(document, dict) else None
    if not isinstance(detail, list):
        return None
    errors = [
        error
        for error in detail
        if isinstance(error, dict)
        and isinstance(error.get("type"), str)
        and isinstance(error.get("loc"), list)
    ]
    return errors or None


def _location(error: dict[str, Any]) -> str:
    location = error["loc"]
    return location[0] if location and isinstance(location[0], str) else "body"


def _fixable(error: dict[str, Any]) -> bool:
    kind = error["type"]
    message = error.get("msg")
    if kind in FIXABLE_TYPES or _V1_TYPE.fullmatch(kind):
        return True
    # A type of its own (PydanticCustomError) is judged by its message.
    return (
        kind not in LEFT_OUT_TYPES
        and isinstance(message, str)
        and VALIDATION_ERROR.search(message) is not None
    )


# A field reference: the part of the request it is in ("body", "query", …) and its path
# there, as the validator spelled it (a number steps into an array).
Reference = tuple[str, tuple[str | int, ...]]

# Where an error list is kept, and the keys an error puts its field under.
_ERROR_LISTS = ("detail", "errors", "issues", "violations", "invalid-params", "invalid_params")
_FIELD_KEYS = (
    "loc",
    "path",
    "pointer",
    "instancePath",
    "instanceLocation",
    "field",
    "param",
    "parameter",
    "property",
    "propertyPath",
)
_PARAM_LISTS = ("invalid-params", "invalid_params")
_PARAM_KEYS = (*_FIELD_KEYS, "name")
_PARTS = frozenset({"body", *_OUTSIDE_BODY})
# Rails's errors of the record as a whole, not of a field.
_NOT_FIELDS = frozenset({"base", "message", "error", "errors", "code", "status", "detail"})
_MAX_ERRORS = 100
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.\[\]-]*")
# Fields spelled out in a message: Go's encoding/json, go-playground/validator and Echo,
# Zod's prettifyError ("→ at nights"), express-openapi-validator's path.
_TEXT_FIELDS = (
    re.compile(r"Go struct field [\w.]*?\.([\w.]+) of type"),
    re.compile(r"Key: '([\w.\[\]]+)' Error:"),
    re.compile(r"\bfield=([\w.\[\]]+)"),
    re.compile(r"\u2192 at ([\w.\[\]]+)"),
)
_OPENAPI_PATH = re.compile(r"\brequest/(body|query|path|headers)/([\w/.-]*\w)")
# pydantic's text: "2 validation errors for Model", then each error's location on a line
# of its own, its message and link indented under it.
_PYDANTIC_TEXT = re.compile(r"validation errors? for \w+\n")
_PYDANTIC_LOCATION = re.compile(r"[A-Za-z_][\w.\[\]]*")


def field_references(text: str, message: str = "") -> list[Reference]:
    """The fields an error answer names, each with the request part it is in: in its body's
    structure (``text``, read as JSON) and in the words of its body and of its envelope's
    ``message``."""
    found: list[Reference] = []
    document = parse_json(text) if text else None
    if isinstance(document, dict):
        _from_structure(document, found)
    if document is None or isinstance(document, str):
        message = f"{message}\n{document if isinstance(document, str) else text}"
    elif isinstance(document, dict):
        texts = [document.get(key) for key in ("message", "detail", "error", "title")]
        message = "\n".join([message, *(text for text in texts if isinstance(text, str))])
    _from_text(message, found)
    return found[:_MAX_ERRORS]


def _from_structure(document: dict[str, Any], found: list[Reference]) -> None:
    holders = [document, *(v for v in (document.get("error"),) if isinstance(v, dict))]
    for holder in holders:
        for key in _ERROR_LISTS:
            errors = holder.get(key)
            if isinstance(errors, list):
                # RFC 9457's invalid parameters name theirs in ``name``.
                named_by = _PARAM_KEYS if key in _PARAM_LISTS else _FIELD_KEYS
                for error in errors[:_MAX_ERRORS]:
                    _from_error(error, found, named_by)
            elif isinstance(errors, dict) and _is_message_map(errors):
                found += [("body", _split(name)) for name in errors if name not in _NOT_FIELDS]
    validation = document.get("validation")  # celebrate: one report per request part
    if isinstance(validation, dict):
        for part, report in validation.items():
            keys = report.get("keys") if isinstance(report, dict) else None
            if isinstance(keys, list):
                found += [(str(part), _split(key)) for key in keys if isinstance(key, str)]
    if _is_message_map(document) and all(isinstance(v, list) for v in document.values()):
        # Rails: every key a field (or "base"), every value its messages.
        found += [("body", _split(name)) for name in document if name not in _NOT_FIELDS]


def _from_error(
    error: Any, found: list[Reference], field_keys: tuple[str, ...] = _FIELD_KEYS
) -> None:
    if not isinstance(error, dict):
        return
    part = error.get("location") or error.get("in") or "body"
    part = part if isinstance(part, str) else "body"
    where = next((error[key] for key in field_keys if key in error), None)
    if isinstance(where, str | list) and where:
        found.append(_located(part, where))
    for key in ("keys", "fields"):  # unrecognized keys; express-validator's unknown fields
        named = error.get(key)
        if isinstance(named, list):
            for item in named[:_MAX_ERRORS]:
                if isinstance(item, str):
                    found.append((part, _split(item)))
                else:
                    _from_error(item, found)


def _located(part: str, where: str | list[Any]) -> Reference:
    """A path as a validator wrote it: a list, a JSON pointer, a dotted name."""
    parts: tuple[str | int, ...] = (
        tuple(item for item in where if isinstance(item, str | int) and not isinstance(item, bool))
        if isinstance(where, list)
        else _split(where)
    )
    # pydantic's ``loc`` and express-openapi-validator's ``/body/lat`` lead with the part.
    if parts and isinstance(parts[0], str) and parts[0] in _PARTS:
        return parts[0], parts[1:]
    return part, parts


def _split(where: str) -> tuple[str | int, ...]:
    text = where.removeprefix("#").removeprefix("$").strip()
    pieces = re.split(r"[./\[\]]", text)
    return tuple(int(p) if p.isdigit() else p for p in pieces if p)


def _is_message_map(value: dict[str, Any]) -> bool:
    """Error messages by field: every value a message or a list of them, every key a name."""
    if not value:
        return False
    for key, item in value.items():
        if not isinstance(key, str) or _IDENTIFIER.fullmatch(key) is None:
            return False
        messages = item if isinstance(item, list) else [item]
        if not messages or not all(isinstance(m, str) for m in messages):
            return False
    return True


def _from_text(message: str, found: list[Reference]) -> None:
    for pattern in _TEXT_FIELDS:
        found += [("body", _split(match)) for match in pattern.findall(message)]
    found += [(part, _split(path)) for part, path in _OPENAPI_PATH.findall(message)]
    for header in _PYDANTIC_TEXT.finditer(message):
        for line in message[header.end() :].splitlines()[:_MAX_ERRORS]:
            if line[:1].isspace():
                continue  # an error's message or link
            if _PYDANTIC_LOCATION.fullmatch(line) is None:
                break
            found.append(("body", _split(line)))


def field_key(name: str) -> str:
    """A field's name as names compare: ``CheckIn``, ``check_in`` and ``checkIn`` are one;
    letters of any script count (``сумма`` and ``счёт`` are two)."""
    return re.sub(r"[\W_]", "", name.casefold())


def body_fields(text: str, message: str, payload: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The body fields an error answer names (``field_references``), as paths into
    ``payload``: array indices dropped, a type's name before the field
    (go-playground/validator's ``BookingRequest.CheckIn``) left out, and a field the payload
    holds spelled as it spells it (``Units`` for ``units``)."""
    top = {field_key(name): name for name in payload}
    paths = []
    for part, where in field_references(text, message):
        if part in _OUTSIDE_BODY:
            continue
        path = tuple(item for item in where if isinstance(item, str))
        if len(path) > 1 and path[0][:1].isupper() and field_key(path[0]) not in top:
            path = path[1:]
        if path:
            # Spelled as the payload spells it, when it holds the field.
            paths.append((top.get(field_key(path[0]), path[0]), *path[1:]))
    return paths
