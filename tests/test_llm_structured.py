"""The model's answer held to its shape: ``json_schema`` with the tool's schema, the fall
back when an endpoint refuses a form (remembered), and the count of each form, against
scripted OpenAI-compatible endpoints that refuse as OpenAI and llama-cpp-python do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from tests.conftest import completion
from tests.test_llm_reask import ADDRESS_SCHEMA, geocoder
from tests.test_repair import CORRECT_CITY, fix, location_tool

ANSWER_KEYS = ["analysis", "corrected_payload", "is_transient", "can_fix"]

# What llama-cpp-python's server (0.3.36) answers to ``"type": "json_schema"``.
LLAMA_CPP_PYTHON_REFUSAL = {
    "error": {
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
        "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", "
        "'input': 'json_schema'}",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}
# What OpenAI answers a model without structured outputs, then to an unknown member.
OPENAI_NO_JSON_SCHEMA = {
    "error": {
        "message": "Invalid parameter: 'response_format' of type 'json_schema' is not "
        "supported with this model.",
        "type": "invalid_request_error",
        "param": "response_format",
        "code": None,
    }
}
OPENAI_UNKNOWN_SCHEMA = {
    "error": {
        "message": "Unknown parameter: 'response_format.schema'.",
        "type": "invalid_request_error",
        "param": "response_format.schema",
        "code": "unknown_parameter",
    }
}

# What llama.cpp's server answers when it cannot make a grammar of the schema for the model
# (llama.cpp issues 11847 and 21600): the schema or the grammar is named, not the field.
LLAMA_SERVER_GRAMMAR_REFUSALS = [
    'Either "json_schema" or "grammar" can be specified, but not both',
    "Failed to initialize samplers: Unexpected empty grammar stack after accepting piece:"
    " <think> (248068)",
]


def form_of(request: dict[str, Any]) -> str:
    """Which of the three forms a chat completion request asked its answer in."""
    asked = request["response_format"]
    if asked["type"] == "json_schema":
        return "json_schema"
    return "json_object_schema" if "schema" in asked else "json_object"


async def test_the_answer_is_asked_for_in_json_schema_with_the_tools_schema(
    make_tool, make_sidecar, make_llm, tmp_path: Path
):
    llm = await make_llm(
        fix({"api_key": "<redacted-1>", "address": {"city": "Flower Mound", "country": "US"}})
    )
    _, sidecar = await geocoder(make_tool, make_sidecar, llm, tmp_path)

    response = await sidecar.client.post(
        "/geocode", json={"api_key": "key-4242", "address": "Flower Mound, TX"}
    )

    assert response.status == 200
    [request] = llm.requests
    asked = request["response_format"]
    assert (asked["type"], asked["json_schema"]["name"]) == ("json_schema", "payload_repair")
    answer = asked["json_schema"]["schema"]
    assert list(answer["properties"]) == ANSWER_KEYS
    assert answer["required"] == ANSWER_KEYS
    payload_schema, null = answer["properties"]["corrected_payload"]["anyOf"]
    assert null == {"type": "null"}
    # The tool's own schema, but the field holding a secret is left free: the model writes a
    # placeholder there, which the tool's pattern for the real key would not let it write.
    assert payload_schema == {
        **ADDRESS_SCHEMA,
        "properties": {**ADDRESS_SCHEMA["properties"], "api_key": {}},
    }
    assert "key-4242" not in json.dumps(request)
    assert sidecar.metric("sidecar_llm_response_format_total", format="json_schema") == 1


async def test_without_a_schema_the_payload_is_any_object(make_tool, make_sidecar, make_llm):
    tool = await make_tool(location_tool())
    llm = await make_llm(fix({"location": CORRECT_CITY}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 200
    answer = llm.requests[0]["response_format"]["json_schema"]["schema"]
    assert answer["properties"]["corrected_payload"] == {
        "anyOf": [{"type": "object"}, {"type": "null"}]
    }


async def test_an_endpoint_refusing_json_schema_gets_json_object_with_the_schema_from_then_on(
    make_tool, make_sidecar, make_llm
):
    async def llama_cpp_python() -> web.Response:
        if form_of(llm.requests[-1]) == "json_schema":
            return web.json_response(LLAMA_CPP_PYTHON_REFUSAL, status=500)
        return completion(json.dumps(fix({"location": CORRECT_CITY})))

    tool = await make_tool(location_tool())
    llm = await make_llm(llama_cpp_python)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    with capture_logs() as logs:
        first = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})
        # Another failure, so the answer cache does not answer it.
        second = await sidecar.client.post("/w", json={"location": "Flower Mound"})

    assert (first.status, second.status) == (200, 200)
    assert first.headers["X-Sidecar-Trail"] == "404 repair=llm, 200"
    assert [form_of(request) for request in llm.requests] == [
        "json_schema",
        "json_object_schema",
        "json_object_schema",
    ]
    refused, taken = llm.requests[0]["response_format"], llm.requests[1]["response_format"]
    assert taken == {"type": "json_object", "schema": refused["json_schema"]["schema"]}
    metric = sidecar.metric
    assert metric("sidecar_llm_response_format_total", format="json_object_schema") == 2
    assert metric("sidecar_llm_response_format_total", format="json_schema") == 0
    assert metric("sidecar_llm_requests_total", result="ok") == 2
    assert metric("sidecar_llm_requests_total", result="error") == 0
    assert [entry for entry in logs if entry["event"] == "llm_response_format_refused"] == [
        {
            "event": "llm_response_format_refused",
            "response_format": "json_schema",
            "status": 500,
            "log_level": "warning",
        }
    ]


async def test_an_endpoint_refusing_both_schema_forms_gets_plain_json_mode(
    make_tool, make_sidecar, make_llm
):
    async def openai_without_structured_outputs() -> web.Response:
        form = form_of(llm.requests[-1])
        if form == "json_schema":
            return web.json_response(OPENAI_NO_JSON_SCHEMA, status=400)
        if form == "json_object_schema":
            return web.json_response(OPENAI_UNKNOWN_SCHEMA, status=400)
        return completion(json.dumps(fix({"location": CORRECT_CITY})))

    tool = await make_tool(location_tool())
    llm = await make_llm(openai_without_structured_outputs)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    first = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})
    second = await sidecar.client.post("/w", json={"location": "Flower Mound"})

    assert (first.status, second.status) == (200, 200)
    assert [form_of(request) for request in llm.requests] == [
        "json_schema",
        "json_object_schema",
        "json_object",
        "json_object",
    ]
    assert llm.requests[-1]["response_format"] == {"type": "json_object"}
    assert sidecar.metric("sidecar_llm_response_format_total", format="json_object") == 2
    assert sidecar.metric("sidecar_llm_requests_total", result="ok") == 2


@pytest.mark.parametrize(
    "message", LLAMA_SERVER_GRAMMAR_REFUSALS, ids=["schema-or-grammar", "empty-grammar-stack"]
)
async def test_a_schema_the_endpoint_cannot_make_a_grammar_of_falls_back_to_json_mode(
    make_tool, make_sidecar, make_llm, message
):
    async def llama_server() -> web.Response:
        if form_of(llm.requests[-1]) != "json_object":
            error = {"code": 400, "message": message, "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=400)
        return completion(json.dumps(fix({"location": CORRECT_CITY})))

    tool = await make_tool(location_tool())
    llm = await make_llm(llama_server)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 200
    assert [form_of(request) for request in llm.requests] == [
        "json_schema",
        "json_object_schema",
        "json_object",
    ]
    assert sidecar.metric("sidecar_llm_requests_total", result="ok") == 1


async def test_a_refusal_naming_something_else_is_the_calls_error_and_changes_no_form(
    make_tool, make_sidecar, make_llm
):
    too_long = {
        "error": {
            "message": "This model's maximum context length is 4096 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }

    async def refuse() -> web.Response:
        return web.json_response(too_long, status=400)

    tool = await make_tool(location_tool())
    llm = await make_llm(refuse)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    first = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})
    second = await sidecar.client.post("/w", json={"location": "Flower Mound"})

    assert (first.status, second.status) == (404, 404)
    assert [form_of(request) for request in llm.requests] == ["json_schema", "json_schema"]
    assert sidecar.metric("sidecar_llm_requests_total", result="error") == 2
    assert sidecar.metric("sidecar_llm_response_format_total", format="json_schema") == 2


async def test_a_server_error_that_merely_names_response_format_changes_no_form(
    make_tool, make_sidecar, make_llm
):
    crashed = {
        "error": {
            "message": "worker crashed while decoding with response_format json_schema; retry",
            "type": "server_error",
        }
    }

    async def crashes_once() -> web.Response:
        if len(llm.requests) == 1:
            return web.json_response(crashed, status=500)
        return completion(json.dumps(fix({"location": CORRECT_CITY})))

    tool = await make_tool(location_tool())
    llm = await make_llm(crashes_once)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    first = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})
    second = await sidecar.client.post("/w", json={"location": "Flower Mound"})

    # The crash is that call's error; the endpoint still takes the best form.
    assert (first.status, second.status) == (404, 200)
    assert [form_of(request) for request in llm.requests] == ["json_schema", "json_schema"]
    assert sidecar.metric("sidecar_llm_requests_total", result="error") == 1
