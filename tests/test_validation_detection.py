"""Which 400/422 answers a changed payload can fix: pydantic's own errors, decided per type."""

from __future__ import annotations

import datetime
import enum
import typing
import uuid
from decimal import Decimal
from typing import Annotated, Literal

import orjson
import pydantic
import pytest
from pydantic_core.core_schema import ErrorType

from sidecar.retry.classify import Action, classify
from sidecar.tool.envelopes import Reply, parse_failure
from sidecar.tool.validation import FIXABLE_TYPES, LEFT_OUT_TYPES, Finding, find

RETRY_ON = frozenset({500, 502, 503, 504})


def test_every_pydantic_error_type_is_decided_once():
    """The table was written against pydantic-core 2.46. A tool may run an older or newer
    pydantic than this suite: a type the table does not name is judged by its message
    (next test), so a new pydantic release changes no verdict and fails no build."""
    decided = FIXABLE_TYPES | set(LEFT_OUT_TYPES)
    assert FIXABLE_TYPES.isdisjoint(LEFT_OUT_TYPES)
    assert len(decided & set(typing.get_args(ErrorType))) >= 100


@pytest.mark.parametrize(
    ("message", "fixable"),
    [("Input should be a valid postcode", True), ("the moon is not in phase", False)],
)
def test_an_error_type_the_table_does_not_name_is_judged_by_its_message(message, fixable):
    detail = [{"type": "a_type_from_a_newer_pydantic", "loc": ["body", "zip"], "msg": message}]
    text = orjson.dumps({"detail": detail}).decode()
    assert (find("", text) is Finding.IN_BODY) is fixable


class Units(enum.Enum):
    METRIC = "metric"
    IMPERIAL = "imperial"


class Forecast(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    units: Literal["metric", "imperial"] = "metric"
    system: Units = Units.METRIC
    day: datetime.date | None = None
    at: datetime.datetime | None = None
    start: datetime.time | None = None
    station: uuid.UUID | None = None
    callback: pydantic.AnyUrl | None = None
    city: Annotated[str, pydantic.Field(min_length=2, max_length=20)] = "Tokyo"
    days: Annotated[int, pydantic.Field(gt=0, le=14, multiple_of=1)] = 1
    tags: Annotated[list[str], pydantic.Field(max_length=2)] = []
    price: Annotated[Decimal, pydantic.Field(max_digits=4, decimal_places=2)] = Decimal(1)
    hourly: bool = False


def fastapi_422(payload: dict) -> tuple[str, str]:
    """The error type pydantic reports for ``payload``, and FastAPI's 422 body for it."""
    try:
        Forecast.model_validate_json(orjson.dumps(payload))
    except pydantic.ValidationError as error:
        errors = orjson.loads(error.json())
    else:
        raise AssertionError(f"{payload} is valid")
    for item in errors:
        item["loc"] = ["body", *item["loc"]]
    return errors[0]["type"], orjson.dumps({"detail": errors}).decode()


@pytest.mark.parametrize(
    ("payload", "expected_type"),
    [
        ({"units": "Metric"}, "literal_error"),
        ({"system": "METRIC"}, "enum"),
        ({"day": "2024-06-01T10:30:00"}, "date_from_datetime_inexact"),
        ({"day": "tomorrow"}, "date_from_datetime_parsing"),
        ({"at": "10:30"}, "datetime_from_date_parsing"),
        ({"start": "25:00"}, "time_parsing"),
        ({"station": "not-a-uuid"}, "uuid_parsing"),
        ({"callback": "no scheme"}, "url_parsing"),
        ({"city": "T"}, "string_too_short"),
        ({"city": "T" * 30}, "string_too_long"),
        ({"days": 0}, "greater_than"),
        ({"days": 15}, "less_than_equal"),
        ({"days": "three"}, "int_parsing"),
        ({"tags": ["a", "b", "c"]}, "too_long"),
        ({"price": "12.345"}, "decimal_max_digits"),
        ({"hourly": "perhaps"}, "bool_parsing"),
        ({"nope": 1}, "extra_forbidden"),
    ],
)
def test_pydantic_body_errors_are_repaired(payload, expected_type):
    error_type, body = fastapi_422(payload)
    assert error_type == expected_type
    verdict = classify(Reply(422, text=body), RETRY_ON)
    assert (verdict.action, verdict.reason) == (Action.REPAIR, "validation")


def detail(*errors: tuple[list, str], msg: str = "Input should be a valid integer") -> str:
    return orjson.dumps(
        {"detail": [{"type": kind, "loc": loc, "msg": msg, "input": None} for loc, kind in errors]}
    ).decode()


@pytest.mark.parametrize(
    ("text", "action"),
    [
        # Nothing in the body is wrong: no payload can help.
        (detail((["query", "limit"], "int_parsing")), Action.DONE),
        (detail((["path", "id"], "uuid_parsing"), (["header", "x-key"], "missing")), Action.DONE),
        (detail((["cookie", "session"], "missing")), Action.DONE),
        # Body and query both wrong: the body part can still be repaired.
        (
            detail((["query", "limit"], "int_parsing"), (["body", "lat"], "float_parsing")),
            Action.REPAIR,
        ),
        # pydantic's own errors, not FastAPI's: located by field, so in the body.
        (detail((["lat"], "float_parsing")), Action.REPAIR),
        (detail(([], "missing")), Action.REPAIR),
        # pydantic v1 (FastAPI before 0.100).
        (detail((["body", "lat"], "value_error.missing")), Action.REPAIR),
        (detail((["body", "lat"], "type_error.integer")), Action.REPAIR),
        # A custom error type: decided by its message.
        (detail((["body", "n"], "not_prime"), msg="n must be greater than 1"), Action.REPAIR),
        (detail((["body", "n"], "not_prime"), msg="n is not prime"), Action.DONE),
        # A type no JSON payload can clear, whatever its message says.
        (detail((["body", "cb"], "callable_type"), msg="Input should be callable"), Action.DONE),
    ],
)
def test_fastapi_detail_lists_are_decided_error_by_error(text, action):
    assert classify(Reply(422, text=text), RETRY_ON).action is action


def test_a_detail_list_cut_at_the_sample_size_falls_back_to_patterns():
    cut = detail(*[(["body", f"field{n}"], "enum") for n in range(200)])[:4096]
    assert classify(Reply(422, text=cut), RETRY_ON).action is Action.REPAIR


@pytest.mark.parametrize(
    "message",
    [
        "Input should be 'metric' or 'imperial'",
        "Field required",
        "String should have at least 2 characters",
        "Extra inputs are not permitted",
    ],
)
def test_pydantic_messages_inside_an_envelope_are_repaired(message):
    failure = parse_failure(
        {"success": False, "error": {"code": "BAD", "message": message}}, success_status=False
    )
    verdict = classify(Reply(400, failure), RETRY_ON)
    assert (verdict.action, verdict.reason) == (Action.REPAIR, "validation")


# The error formats of validators beside pydantic, as their libraries write them (the
# messages and shapes of each one's source, as bench/validator_corpus.json records them):
# which part of the request each names decides whether a new payload can help.
ZOD_ISSUES = {
    "errors": [
        {
            "code": "invalid_value",
            "values": ["metric", "imperial"],
            "path": ["units"],
            "message": 'Invalid option: expected one of "metric"|"imperial"',
        }
    ]
}
EXPRESS_VALIDATOR = {
    "errors": [{"type": "field", "value": "C", "msg": "Invalid value", "path": "units",
                "location": "body"}]
}  # fmt: skip
EXPRESS_VALIDATOR_QUERY = {
    "errors": [{"type": "field", "value": "x", "msg": "Invalid value", "path": "limit",
                "location": "query"}]
}  # fmt: skip
OPENAPI_VALIDATOR = {
    "message": "request/body/lat must be number",
    "errors": [{"path": "/body/lat", "message": "must be number",
                "errorCode": "type.openapi.validation"}],
}  # fmt: skip
OPENAPI_VALIDATOR_QUERY = {
    "message": "request/query/limit must be integer",
    "errors": [{"path": "/query/limit", "message": "must be integer",
                "errorCode": "type.openapi.validation"}],
}  # fmt: skip
PROBLEM_POINTERS = {
    "type": "https://example.net/validation-error",
    "title": "Your request is not valid.",
    "status": 422,
    "errors": [{"detail": "0 is less than the minimum of 1", "pointer": "#/nights"}],
}
CELEBRATE_QUERY = {
    "statusCode": 400,
    "error": "Bad Request",
    "message": "Validation failed",
    "validation": {"query": {"source": "query", "keys": ["page"], "message": '"page" ...'}},
}


@pytest.mark.parametrize(
    ("body", "finding"),
    [
        (ZOD_ISSUES, Finding.IN_BODY),
        (EXPRESS_VALIDATOR, Finding.IN_BODY),
        (EXPRESS_VALIDATOR_QUERY, Finding.OUTSIDE_BODY),
        (OPENAPI_VALIDATOR, Finding.IN_BODY),
        (OPENAPI_VALIDATOR_QUERY, Finding.OUTSIDE_BODY),
        (PROBLEM_POINTERS, Finding.IN_BODY),
        (CELEBRATE_QUERY, Finding.OUTSIDE_BODY),
        # Rails: messages by attribute; "base" is the record's, not a field's.
        ({"price": ["is not a number"]}, Finding.IN_BODY),
        ({"base": ["is locked"]}, Finding.NONE),
        # go-playground/validator, as gin answers it, and its translated messages
        (
            {"error": "Key: 'WeatherRequest.Units' Error:Field validation for 'Units' failed on "
                      "the 'oneof' tag"},
            Finding.IN_BODY,
        ),
        ({"errors": {"BookingRequest.Guests": "Guests is a required field"}}, Finding.IN_BODY),
        # Echo's bind error; pydantic's text in a problem's detail
        ({"message": "Unmarshal type error: expected=float64, got=string, field=amount"},
         Finding.IN_BODY),
        (
            {"type": "about:blank", "title": "Unprocessable Entity", "status": 422,
             "detail": "1 validation error for Quote\nsymbol\n  String should match pattern "
                       "'^[A-Z]{1,5}$' [type=string_pattern_mismatch, input_value='Microsoft']"},
            Finding.IN_BODY,
        ),
        # Spring's defaults: a body its bean validation refused, one it could not read
        ({"type": "about:blank", "title": "Bad Request", "status": 400,
          "detail": "Invalid request content."}, Finding.IN_BODY),
        ({"type": "about:blank", "title": "Bad Request", "status": 400,
          "detail": "Failed to read request"}, Finding.IN_BODY),
        # Not a validation error at all.
        ({"error": "quota exceeded for this project"}, Finding.NONE),
    ],
)  # fmt: skip
def test_what_other_validators_errors_say_about_the_body(body, finding):
    failure = parse_failure(body, success_status=False)
    message = failure.message if failure is not None else ""
    assert find(message, orjson.dumps(body).decode()) is finding


def test_jsonschemas_own_messages_are_validation_errors():
    """Python's jsonschema, run: each of its messages for a bad body reads as one."""
    import jsonschema

    schema = {
        "type": "object",
        "required": ["currency"],
        "additionalProperties": False,
        "properties": {
            "currency": {"enum": ["USD", "EUR"]},
            "nights": {"type": "integer", "minimum": 1},
            "date": {"type": "string", "format": "date"},
            "lat": {"type": "number"},
        },
    }
    bodies = [{"currency": "EURO"}, {"nights": 0, "currency": "USD"}, {"lat": "1"}, {"x": 1}]
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    messages = [error.message for body in bodies for error in checker.iter_errors(body)]
    messages += [e.message for e in checker.iter_errors({"currency": "USD", "date": "2026-02-30"})]
    assert len(messages) >= 6
    for message in messages:
        assert find(message, "") is Finding.IN_BODY, message
