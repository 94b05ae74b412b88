"""Whether a 400/422 says the request body is invalid — something a new payload can fix.

Read in this order:

1. A FastAPI / pydantic ``{"detail": [{"type", "loc", "msg"}, …]}`` list, error by error:
   an error of a type below located in the body (``loc`` not starting with ``query``,
   ``path``, ``header`` or ``cookie``) makes the answer repairable; when every error lies
   outside the body, no payload can fix it.
2. Otherwise, a pydantic error type quoted anywhere in the text, or a phrase of Go's
   ``encoding/json``, JSON Schema validators, pydantic messages or hand-written errors.
"""

from __future__ import annotations

import enum
import re
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

_OUTSIDE_BODY = frozenset({"query", "path", "header", "cookie"})
# pydantic v1 (FastAPI before 0.100) names its types type_error.* and value_error.*.
_V1_TYPE = re.compile(r"(?:type|value)_error(?:\.[a-z_]+)*")

# Type and validation errors that a changed payload can fix: Go's encoding/json, pydantic
# and FastAPI, JSON Schema validators and the common hand-written phrasings.
VALIDATION_ERROR = re.compile(
    r"cannot unmarshal|type mismatch|invalid type|wrong type|must be (?:a|an|of type)\b"
    r"|must be (?:greater|less|at least|at most|between|one of)|is required|required field"
    r"|missing required|field required|is not valid under|is not of type|expected (?:a |an )?"
    r"(?:string|number|integer|int|float|bool|boolean|object|array)|invalid (?:value|format)"
    r"|input should be|should have at (?:least|most)|extra inputs are not permitted"
    r"|\"type\":\s*\"(?:(?:type|value)_error[a-z_.]*|"
    + "|".join(sorted(FIXABLE_TYPES, key=len, reverse=True))
    + r")\"",
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
