"""The LLM layer's prompt builders on arbitrary JSON: a tool's answer, the agent's payload
and a schema of any shape read into a prompt without raising, and a secret the payload
holds under a secret-looking name is never part of it."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.repair.llm_examples import EXAMPLE_TURNS
from sidecar.repair.llm_prompt import Conversation, LlmRequest, going_on, opening, reask
from sidecar.repair.redact import Redactor
from sidecar.tool.envelopes import ToolFailure

SECRET = "zq-SECRET-7391"

keys = st.sampled_from(["name", "items", "0", "1", "loc", "msg", "field", "type", "a.b", ""])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)  # what orjson reads as an integer
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["items.1.name", "body.name", SECRET, "name is required"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys | st.text(max_size=6), inner),
    max_leaves=20,
)
payloads = st.dictionaries(keys, json_values, max_size=5).map(
    lambda fields: {**fields, "api_key": SECRET}
)
# A FastAPI detail list, a Go message or free text, each with or without the secret echoed.
body_texts = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda detail, hint: orjson.dumps({"detail": detail, "hint": hint}).decode(),
        st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(["missing", "string_type"]),
                    "loc": st.lists(json_values, max_size=4),
                },
                optional={"msg": json_values},
            ),
            max_size=3,
        ),
        json_values,
    ),
    st.builds(
        "json: cannot unmarshal {} into Go struct field T.{} of type {}".format,
        st.sampled_from(["string", "number"]),
        keys,
        st.sampled_from(["float64", "[]string", "bool", "T"]),
    ),
)
failures = st.none() | st.builds(
    ToolFailure,
    dialect=st.just("gomind"),
    code=st.text(max_size=8),
    message=st.text(max_size=40) | st.just(f"key {SECRET} refused"),
    category=st.text(max_size=8),
    details=st.dictionaries(keys | st.text(max_size=6), json_values, max_size=4),
)
# Configuration and the model's own writing: they never hold the agent's secret.
no_secret = json_values.filter(lambda value: SECRET not in repr(value))
schemas = st.none() | st.dictionaries(
    st.sampled_from(["type", "properties", "items", "required"]), no_secret
)


def request(
    failure: ToolFailure | None,
    body_text: str,
    payload: dict[str, Any],
    schema: Any,
    earlier: Conversation | None = None,
) -> LlmRequest:
    return LlmRequest(
        method="POST",
        route="default",
        path="/w",
        path_template="/w",
        status=400,
        failure=failure,
        body_text=body_text,
        payload=payload,
        schema=schema,
        attempt=1,
        intent=None,
        tried=(),
        earlier=earlier,
    )


@settings(max_examples=300)
@given(failures, body_texts, payloads, schemas, st.dictionaries(keys, no_secret, max_size=4))
def test_any_failure_reads_into_a_prompt_without_the_secret(
    failure, body_text, payload, schema, written
):
    first = request(failure, body_text, payload, schema)
    redactor = Redactor()
    messages = opening(first, redactor)
    messages += reask(
        '{"can_fix": true}', "corrected_payload is not a JSON object", first, redactor, written
    )
    conversation = Conversation(tuple(messages), redactor)
    messages = going_on(conversation, request(failure, body_text, payload, schema, conversation))

    assert SECRET not in orjson.dumps(messages).decode()
    # The key keeps its one placeholder from the first turn to the last.
    opened = orjson.loads(messages[len(EXAMPLE_TURNS) + 1]["content"])
    refused = orjson.loads(messages[-1]["content"].split("\n")[1])
    assert opened["failed_payload"]["api_key"] == refused["failed_payload"]["api_key"]
    assert opened["failed_payload"]["api_key"].startswith("<redacted-")
