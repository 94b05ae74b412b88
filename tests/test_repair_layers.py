"""The deterministic repair pieces as pure functions: coercion, adjustments, redaction, schemas."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.repair.adjustments import adjust
from sidecar.repair.coercion import coerce
from sidecar.repair.llm_answer import Refused, check, check_correction
from sidecar.repair.redact import PutBackTooLarge, Redactor, is_secret_name
from sidecar.repair.schemas import RouteSchema, parse_document, resolve
from sidecar.tool.envelopes import ToolFailure
from tests.test_llm_prompt_fuzz import request

POINT = {
    "type": "object",
    "properties": {
        "lat": {"type": "number"},
        "days": {"type": "integer"},
        "hourly": {"type": "boolean"},
        "label": {"type": "string"},
        "radius": {"type": ["number", "null"]},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "where": {
            "type": "object",
            "properties": {"zoom": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
        },
        "extra": {"type": "object", "additionalProperties": {"type": "number"}},
    },
}


def test_coercion_converts_exact_values_at_every_depth():
    value = {
        "lat": "35.6",
        "days": "5",
        "hourly": "TRUE",
        "label": 12,
        "radius": "null",
        "tags": ["1", 2, "x"],
        "where": {"zoom": "7"},
        "extra": {"a": "1.5", "b": 2},
        "unknown": "35.6",
    }
    coerced, changed = coerce(value, POINT)
    assert coerced == {
        "lat": 35.6,
        "days": 5,
        "hourly": True,
        "label": "12",
        "radius": None,
        "tags": [1, 2, "x"],
        "where": {"zoom": "7"},  # already fits the string branch
        "extra": {"a": 1.5, "b": 2},
        "unknown": "35.6",
    }
    assert sorted(changed) == sorted(
        ["lat", "days", "hourly", "label", "radius", "tags[0]", "extra.a"]
    )


@pytest.mark.parametrize(
    ("value", "schema"),
    [
        ("5.5", {"type": "integer"}),
        ("abc", {"type": "number"}),
        ("nan", {"type": "number"}),
        ("1e999", {"type": "number"}),
        ("yes", {"type": "boolean"}),
        (True, {"type": "string"}),
        ({"a": 1}, {"type": "string"}),
        (35.6, {"type": "number"}),
        ("35.6", {}),
        ("35.6", "not a schema"),
    ],
)
def test_values_that_cannot_or_need_not_be_coerced_are_left_alone(value, schema):
    assert coerce(value, schema) == (value, [])


def test_any_of_prefers_a_branch_the_value_already_fits():
    schema = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert coerce("3", schema) == (3, ["$"])
    assert coerce(None, schema) == (None, [])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=25,
)
schemas = st.recursive(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["number", "integer", "boolean", "string", "null", "object"])}
    ),
    lambda inner: (
        st.fixed_dictionaries({"type": st.just("array"), "items": inner})
        | st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=6), inner)}
        )
        | st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)})
    ),
    max_leaves=10,
)


@given(json_values, schemas)
def test_coercion_never_raises_and_reports_every_change(value, schema):
    coerced, changed = coerce(value, schema)
    if not changed:
        assert coerced == value


def test_adjustments_from_mira_and_suggested_details():
    failure = ToolFailure(
        dialect="mira",
        details={"suggested_city": "Tokyo", "expected_units": "metric", "suggested_unrelated": 1},
        parameter_adjustments={"options.precision": 2},
    )
    adjusted, changed = adjust({"city": "Tokio", "units": "si", "options": {}}, failure)
    assert adjusted == {"city": "Tokyo", "units": "metric", "options": {"precision": 2}}
    assert sorted(changed) == ["city", "options.precision", "units"]


def test_adjustments_that_change_nothing_report_nothing():
    failure = ToolFailure(dialect="mira", parameter_adjustments={"units": "metric"})
    assert adjust({"units": "metric"}, failure) == ({"units": "metric"}, [])
    blocked = ToolFailure(dialect="mira", parameter_adjustments={"units.x": 1})
    assert adjust({"units": "metric"}, blocked) == ({"units": "metric"}, [])


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True),
        ("db_password", True),
        ("api_key", True),
        ("apiKey", True),
        ("X-Api-Key", True),
        ("access_token", True),
        ("token", True),
        ("client_secret", True),
        ("Authorization", True),
        ("private_key", True),
        ("key", True),
        ("session_id", True),
        ("max_tokens", False),
        ("keyword", False),
        ("monkey", False),
        ("bypass", False),
        ("author", False),
        ("location", False),
    ],
)
def test_secret_looking_names(name, secret):
    assert is_secret_name(name) is secret


def test_redaction_round_trip_keeps_types_and_embedded_secrets():
    redactor = Redactor()
    payload = {
        "pin": 1234,
        "token": "t-abc",
        "nested": [{"password": "p@ss"}],
        "url": "https://x/y?key=k-777&q=1",
        "header": "Bearer abcdef123456",
        "city": "Tokyo",
    }
    redacted = redactor.redact(payload)
    text = repr(redacted)
    for secret in ("1234", "t-abc", "p@ss", "k-777", "abcdef123456"):
        assert secret not in text
    assert redacted["city"] == "Tokyo"
    assert redacted["url"].startswith("https://x/y?key=<redacted-")
    assert redactor.restore(redacted) == payload


@given(json_values)
def test_redaction_always_restores(value):
    redactor = Redactor()
    original = {"api_key": value, "text": f"see https://x/?token={value}"}
    assert redactor.restore(redactor.redact(original)) == original


def test_a_placeholder_no_secret_has_is_written_back_as_the_model_wrote_it():
    """A model that invents ``<redacted-7>`` (a real small one did, for a one-time password)
    gets its text back, judged as any other: 0.5 recursed on it until a RecursionError
    answered the agent 500."""
    redactor = Redactor()
    shown = redactor.redact({"password": "hunter2", "otp": "123 456"})
    written = {**shown, "otp": "<redacted-7>", "note": "<redacted-7> and <redacted-1>"}
    assert redactor.restore(written) == {
        "password": "hunter2",
        "otp": "<redacted-7>",
        "note": "<redacted-7> and hunter2",
    }


def test_a_payload_holding_placeholders_own_text_restores_in_bounded_steps():
    redactor = Redactor()
    payload = {"password": "<redacted-2>", "token": "<redacted-1>"}
    assert redactor.restore(redactor.redact(payload)) == payload


def test_a_secret_holding_its_own_placeholder_cannot_grow_the_answer_as_a_power():
    """An agent's password of eight ``<redacted-1>``, once it is ``<redacted-1>`` itself,
    would be put back into itself eight levels deep: 8**9 copies, 1.6 GB on the event loop.
    Past four times the secrets' text, the answer is refused as too large."""
    redactor = Redactor()
    shown = redactor.redact({"password": "<redacted-1>" * 8, "note": "x"})
    assert shown == {"password": "<redacted-1>", "note": "x"}
    with pytest.raises(PutBackTooLarge):
        redactor.restore({**shown, "note": "see <redacted-1>"})
    answer = orjson.dumps(
        {
            "can_fix": True,
            "corrected_payload": {"password": "<redacted-1>", "note": "<redacted-1>."},
        }
    ).decode()
    checked = check(
        answer, redactor, request(None, "", {"password": "<redacted-1>" * 8, "note": "x"}, None)
    )
    assert checked.refused is not None and checked.refused.kind == "too_large"
    # The same secret put back where the agent had it is the agent's value, as sent.
    assert redactor.restore(shown) == {"password": "<redacted-1>" * 8, "note": "x"}


def test_a_placeholder_written_in_every_field_cannot_make_a_payload_of_secrets():
    redactor = Redactor()
    redactor.redact({"token": "t" * 5000})
    assert redactor.restore({"token": "<redacted-1>", "copy": "<redacted-1>"})["copy"] == "t" * 5000
    with pytest.raises(PutBackTooLarge):
        redactor.restore({f"f{n}": "<redacted-1>" for n in range(10_000)})


def test_corrections_are_checked_against_what_was_tried_size_and_schema():
    original = {"location": "A"}
    check_correction({"location": "B"}, original, set(), {"type": "object"})
    with pytest.raises(Refused, match="already tried"):
        from sidecar.repair.payload import fingerprint

        check_correction({"location": "A"}, original, {fingerprint(original)}, None)
    with pytest.raises(Refused, match="four times"):
        check_correction({"location": "B" * 100}, original, set(), None)
    with pytest.raises(Refused, match="schema"):
        check_correction(
            {"location": 5}, original, set(), {"properties": {"location": {"type": "string"}}}
        )


OPENAPI = {
    "openapi": "3.0.0",
    "servers": [{"url": "https://tool.example/v2"}],
    "paths": {
        "/items/{id}": {
            "patch": {
                "requestBody": {
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Item"}}
                    }
                }
            }
        },
        "/items/latest": {
            "patch": {
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"latest": {"type": "boolean"}},
                            }
                        }
                    }
                }
            }
        },
    },
    "components": {
        "schemas": {
            "Item": {
                "type": "object",
                "properties": {
                    "count": {"type": "integer", "nullable": True},
                    "child": {"$ref": "#/components/schemas/Item"},
                },
            },
        }
    },
}


def test_openapi_operations_are_found_by_method_and_path_template():
    schema = RouteSchema(OPENAPI)
    item = schema.body_schema("PATCH", "/items/42")
    assert item is not None
    assert item["properties"]["count"]["type"] == ["integer", "null"]
    assert item["properties"]["child"] == {}  # the recursive reference, cut
    assert schema.body_schema("PATCH", "/v2/items/42") == item
    assert schema.body_schema("PATCH", "/items/latest")["properties"] == {
        "latest": {"type": "boolean"}
    }
    assert schema.body_schema("GET", "/items/42") is None
    assert schema.body_schema("PATCH", "/items/42/more") is None


def test_a_plain_json_schema_applies_to_every_body():
    schema = RouteSchema({"type": "object", "properties": {"a": {"type": "number"}}})
    assert schema.body_schema("POST", "/anything") == {
        "type": "object",
        "properties": {"a": {"type": "number"}},
    }


def test_documents_parse_from_json_or_yaml_and_refs_resolve_safely():
    assert parse_document(b'{"a": 1}') == {"a": 1}
    assert parse_document(b"a: 1\nb: [x]") == {"a": 1, "b": ["x"]}
    assert resolve({"$ref": "#/nope"}, {}) == {}
    assert resolve({"$ref": "other.yaml#/x"}, {}) == {}
