"""Coercion changes only what the schema rejects, and the rest of the body keeps its bytes."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.repair.coercion import coerce
from sidecar.repair.jsontext import elements, rewrite, same
from sidecar.repair.payload import Payload
from sidecar.repair.schemas import BRANCH_INDEX, RouteSchema


def coerced_body(body: bytes, schema: dict) -> tuple[bytes, list[str]]:
    """What the sidecar sends for ``body``: coerced, then spliced into the agent's bytes."""
    payload = Payload(body)
    value, changed = coerce(payload.value, schema)
    return payload.repaired(value, "coercion").body, changed


TRANSFER = {
    "type": "object",
    "properties": {"amount": {"type": "number"}, "account": {"type": "integer"}},
}


def test_only_the_wrong_value_changes_and_every_other_keeps_its_text():
    body = (
        b'{"amount": "10.5", "account": 123456789012345678901234,\n'
        b' "fee": 1.50, "rate": 1e3, "name": "Ren\\u00e9", "nested": {"n": 1E+03}}'
    )

    sent, changed = coerced_body(body, TRANSFER)

    assert changed == ["amount"]
    assert sent == body.replace(b'"10.5"', b"10.5")


def test_a_body_that_fits_is_byte_identical():
    body = b'{ "amount" : 10.50 ,"account":123456789012345678901234 }'
    assert coerced_body(body, TRANSFER) == (body, [])


def test_top_level_arrays_are_coerced():
    schema = {"type": "array", "items": TRANSFER}
    body = b'[{"amount": "2", "account": 99999999999999999999}, {"amount": 1.0}]'

    sent, changed = coerced_body(body, schema)

    assert changed == ["[0].amount"]
    assert sent == b'[{"amount": 2, "account": 99999999999999999999}, {"amount": 1.0}]'


@pytest.mark.parametrize("text", ["١٢", "１２", "12\u00a0", "1_000", "0x10", "nan", "inf", "1e999"])
def test_only_ascii_json_numbers_become_numbers(text):
    assert coerce(text, {"type": "number"}) == (text, [])
    assert coerce(text, {"type": "integer"}) == (text, [])


def test_exact_conversions():
    assert coerce(" 12 ", {"type": "integer"}) == (12, ["$"])
    assert coerce("123456789012345678901234", {"type": "integer"}) == (
        123456789012345678901234,
        ["$"],
    )
    assert coerce("-1.5e2", {"type": "number"}) == (-150.0, ["$"])
    assert coerce(7, {"type": "string"}) == ("7", ["$"])
    # A float this large may be an integer the parser rounded: its digits are unknown.
    assert coerce(1.2345678901234569e23, {"type": "string"}) == (1.2345678901234569e23, [])


def fastapi_filter_schema() -> dict:
    """The request body schema FastAPI 0.1xx publishes for
    ``Annotated[Union[Num, Text], Field(discriminator="op")]``."""
    document = {
        "openapi": "3.1.0",
        "paths": {
            "/filter": {
                "post": {
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [
                                        {"$ref": "#/components/schemas/Num"},
                                        {"$ref": "#/components/schemas/Text"},
                                    ],
                                    "discriminator": {
                                        "propertyName": "op",
                                        "mapping": {
                                            "gt": "#/components/schemas/Num",
                                            "lt": "#/components/schemas/Num",
                                            "contains": "#/components/schemas/Text",
                                        },
                                    },
                                }
                            }
                        }
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "Num": {
                    "type": "object",
                    "required": ["op", "value"],
                    "properties": {
                        "op": {"type": "string", "enum": ["gt", "lt"]},
                        "value": {"type": "number"},
                    },
                },
                "Text": {
                    "type": "object",
                    "required": ["op", "value"],
                    "properties": {
                        "op": {"type": "string", "const": "contains"},
                        "value": {"type": "string"},
                    },
                },
            }
        },
    }
    schema = RouteSchema(document).body_schema("POST", "/filter")
    assert schema is not None
    return schema


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        (b'{"op": "contains", "value": "42"}', b'{"op": "contains", "value": "42"}'),
        (b'{"op": "contains", "value": "007"}', b'{"op": "contains", "value": "007"}'),
        (b'{"op": "gt", "value": "42"}', b'{"op": "gt", "value": 42}'),
        (b'{"value": "0.5", "op": "lt"}', b'{"value": 0.5, "op": "lt"}'),
        # An unknown tag names no branch, and "5" fits neither branch alone: left.
        (b'{"op": "eq", "value": "5"}', b'{"op": "eq", "value": "5"}'),
    ],
)
def test_a_discriminator_picks_the_branch(body, sent):
    assert coerced_body(body, fastapi_filter_schema())[0] == sent


def test_without_a_discriminator_only_one_fitting_branch_coerces():
    num = {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}
    text = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}
    flag = {"type": "object", "properties": {"value": {"type": "boolean"}}, "required": ["value"]}

    # Fits Text already: never touched.
    assert coerce({"value": "42"}, {"oneOf": [num, text]}) == ({"value": "42"}, [])
    # Fits neither as it is; only Num fits once coerced.
    assert coerce({"value": "42"}, {"anyOf": [num, flag]}) == ({"value": 42}, ["value"])
    # "true" coerces to fit either Num (no) or Flag (yes) — one outcome.
    assert coerce({"value": "true"}, {"anyOf": [num, flag]}) == ({"value": True}, ["value"])
    # Two branches would each take a different coerced value: ambiguous, left alone.
    both = {"anyOf": [num, {**flag, "properties": {"value": {"type": "integer"}}}]}
    assert coerce({"value": 1.5, "x": "1"}, both) == ({"value": 1.5, "x": "1"}, [])


def test_an_optional_model_is_followed_even_when_still_invalid():
    model = {
        "type": "object",
        "properties": {"size": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["size", "name"],
    }
    schema = {"anyOf": [model, {"type": "null"}]}
    # "name" is missing: no branch fits even coerced, but only one branch takes an object.
    assert coerce({"size": "3"}, schema) == ({"size": 3}, ["size"])


def test_each_member_gets_exactly_the_subschemas_that_apply_to_it():
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "code": {"type": "string"}},
        "patternProperties": {"^tag_": {"type": "string"}},
        "additionalProperties": {"type": "number"},
    }
    value = {"id": "1", "code": "007", "tag_a": "2", "other": "3"}
    assert coerce(value, schema) == (
        {"id": 1, "code": "007", "tag_a": "2", "other": 3},
        ["id", "other"],
    )

    pair = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}
    assert coerce(["1", "2"], pair) == (["1", 2], ["[1]"])


def test_rewrite_keeps_the_text_of_everything_equal():
    text = '{"a": 1.50, "b": [1E2, "\\u00e9"], "c": {"d": 123456789012345678901234}}'
    old = orjson.loads(text)

    assert rewrite(text, old, {**old, "e": True}) == (
        '{"a":1.50,"b":[1E2, "\\u00e9"],"c":{"d": 123456789012345678901234},"e":true}'
    )
    assert rewrite(text, old, {"c": old["c"]}) == '{"c":{"d": 123456789012345678901234}}'
    assert rewrite(text, old, {**old, "b": [*old["b"], None]}) == (
        '{"a": 1.50, "b": [1E2,"\\u00e9",null], "c": {"d": 123456789012345678901234}}'
    )
    # The last of repeated keys is the value every parser reads: the one that changes.
    assert rewrite('{"a": 1, "a": "2"}', {"a": "2"}, {"a": 2}) == '{"a":2}'
    assert rewrite("not json", None, {"a": 1}) == '{"a":1}'
    # Equal in Python is not equal in JSON.
    assert rewrite("[1, 1.0, 0]", [1, 1.0, 0], [True, 1, False]) == "[true, 1, false]"


# Strategies are kept small: the suite runs twice in CI.
KEYS = st.sampled_from(["a", "b", "c"])
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
# Text that looks like other types is where coercion acts.
TRICKY_TEXT = ["5", " 7 ", "1.5", "007", "1e3", "true", "FALSE", "null", "١٢", "x", ""]
scalars = st.sampled_from(TRICKY_TEXT) | st.sampled_from(
    [None, True, False, 0, 7, -2, 1.5, 2.0, 10**20, "abc", "é"]
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)
type_names = st.sampled_from(TYPES)
leaf_schemas = (
    st.builds(lambda kind: {"type": kind}, type_names)
    | st.builds(lambda kinds: {"type": kinds}, st.lists(type_names, min_size=1, max_size=2))
    | st.builds(lambda low: {"type": "number", "minimum": low}, st.integers(-3, 3))
    | st.builds(lambda values: {"enum": values}, st.lists(scalars, min_size=1, max_size=3))
    | st.just({})
)


def _tagged(branches: list[dict]) -> dict:
    """A discriminated union: branch i pins property ``a`` to the tag ``ti``."""
    tagged = [
        {**branch, "properties": {**branch.get("properties", {}), "a": {"const": f"t{i}"}}}
        for i, branch in enumerate(branches)
    ]
    return {
        "oneOf": tagged,
        "discriminator": {
            "propertyName": "a",
            BRANCH_INDEX: {f"t{i}": i for i in range(len(branches))},
        },
    }


schemas = st.recursive(
    leaf_schemas,
    lambda inner: (
        st.builds(lambda items: {"type": "array", "items": items}, inner)
        | st.builds(
            lambda prefix, items: {"prefixItems": prefix, "items": items},
            st.lists(inner, max_size=2),
            inner,
        )
        | st.builds(
            lambda props, extra, required: {
                "type": "object",
                "properties": props,
                "additionalProperties": extra,
                "required": required,
            },
            st.dictionaries(KEYS, inner, max_size=3),
            inner | st.booleans(),
            st.lists(KEYS, max_size=2, unique=True),
        )
        | st.builds(lambda branches: {"anyOf": branches}, st.lists(inner, min_size=1, max_size=3))
        | st.builds(lambda branches: {"oneOf": branches}, st.lists(inner, min_size=1, max_size=3))
        | st.builds(lambda parts: {"allOf": parts}, st.lists(inner, min_size=1, max_size=2))
        | st.builds(_tagged, st.lists(inner, min_size=1, max_size=3))
    ),
    max_leaves=6,
)


def fits(value, schema) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


SCALARS_OF_TYPE = {
    "null": st.none(),
    "boolean": st.booleans(),
    "integer": st.sampled_from([0, 7, -2, 10**20, 2.0]),
    "number": st.sampled_from([0, 7, 1.5, -0.25, 10**20]),
    "string": st.sampled_from(TRICKY_TEXT),
    "array": st.lists(scalars, max_size=2),
    "object": st.dictionaries(KEYS, scalars, max_size=2),
}


def values_for(schema) -> st.SearchStrategy:
    """Values built to fit ``schema`` more often than chance would (some still do not)."""
    if not isinstance(schema, dict):
        return json_values
    for keyword in ("anyOf", "oneOf", "allOf"):
        if keyword in schema:
            return st.one_of([values_for(branch) for branch in schema[keyword]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "properties" in schema:
        return st.fixed_dictionaries(
            {}, optional={key: values_for(sub) for key, sub in schema["properties"].items()}
        )
    if "prefixItems" in schema:
        return st.tuples(*map(values_for, schema["prefixItems"])).map(list)
    if "items" in schema:
        return st.lists(values_for(schema["items"]), max_size=2)
    kinds = schema.get("type", TYPES)
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return st.one_of([SCALARS_OF_TYPE[kind] for kind in kinds])


@given(schemas, st.data())
def test_a_value_that_fits_its_schema_is_never_changed(schema, data):
    value = data.draw(values_for(schema) | json_values)
    coerced, changed = coerce(value, schema)
    if fits(value, schema):
        assert changed == []
        assert same(coerced, value)
    elif not changed:
        assert same(coerced, value)


raw_scalars = (
    st.integers(-(10**30), 10**30).map(str)
    | st.sampled_from(["1.50", "1e3", "1E+03", "-0.0", "0.10", "2.5e-3", "true", "false", "null"])
    | st.sampled_from(['"\\u00e9"', '"\\/"', '"\\u0661\\u0662"', '"\\t"'])
    | st.sampled_from(TRICKY_TEXT).map(json.dumps)
    | st.text(max_size=3).map(lambda text: json.dumps(text, ensure_ascii=False))
)
spacing = st.sampled_from(["", " ", "\n  "])
raw_values = st.recursive(
    raw_scalars,
    lambda inner: (
        st.builds(
            lambda items, gap: "[" + f",{gap}".join(items) + "]",
            st.lists(inner, max_size=3),
            spacing,
        )
        | st.builds(
            lambda members, gap: (
                "{"
                + gap
                + f",{gap}".join(f"{json.dumps(key)}:{gap}{text}" for key, text in members.items())
                + "}"
            ),
            st.dictionaries(KEYS, inner, max_size=3),
            spacing,
        )
    ),
    max_leaves=8,
)


@given(st.dictionaries(KEYS, raw_values, min_size=1), st.dictionaries(KEYS, schemas), spacing)
def test_members_that_fit_keep_their_exact_bytes(members, properties, gap):
    body = "{" + f",{gap}".join(f'"{key}":{gap}{text}' for key, text in members.items()) + "}"
    schema = {"type": "object", "properties": properties}
    original = Payload(body.encode()).value

    sent, changed = coerced_body(body.encode(), schema)

    if not changed or fits(original, schema):
        assert sent == body.encode()
    sent_text = sent.decode()
    assert same(orjson.loads(sent), orjson.loads(json.dumps(coerce(original, schema)[0])))
    sent_members = {member.key: member for member in elements(sent_text, 0)[0]}
    for key, text in members.items():
        if key not in properties or fits(original[key], properties[key]):
            member = sent_members[key]
            assert sent_text[member.start : member.end] == text
