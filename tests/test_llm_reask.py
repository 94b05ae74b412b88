"""The LLM layer's memory and second chances: what its answer cache is keyed by, and how a
refused answer goes back to the model with the reason, over real sockets."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
from aiohttp import web
from structlog.testing import capture_logs

from tests.conftest import scripted
from tests.test_repair import CORRECT_CITY, fix, location_tool


def size_tool(limits: dict[str, tuple[int, int]]):
    """A tool whose endpoints each take a ``size`` in their own range, and say the same
    thing when it is outside: only the endpoint tells the failures apart."""

    async def sized(request: web.Request) -> web.Response:
        low, high = limits[request.path]
        size = (await request.json()).get("size")
        if isinstance(size, int) and low <= size <= high:
            return web.json_response({"success": True, "data": {"size": size}})
        return web.json_response(
            {
                "success": False,
                "error": {
                    "code": "SIZE_OUT_OF_RANGE",
                    "message": "size is out of range",
                    "category": "INPUT_ERROR",
                    "retryable": True,
                },
            },
            status=400,
        )

    return sized


async def test_a_correction_learned_for_one_endpoint_is_not_reused_for_another(
    make_tool, make_sidecar, make_llm
):
    tool = await make_tool(size_tool({"/a": (1, 10), "/b": (100, 1000)}))
    llm = await make_llm(fix({"size": 5}), fix({"size": 100}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    to_a = await sidecar.client.post("/a", json={"size": 50})
    to_b = await sidecar.client.post("/b", json={"size": 50})

    assert (to_a.status, to_b.status) == (200, 200)
    assert len(llm.requests) == 2
    assert [(seen.raw_path, orjson.loads(seen.body)) for seen in tool.seen] == [
        ("/a", {"size": 50}),
        ("/a", {"size": 5}),
        ("/b", {"size": 50}),
        ("/b", {"size": 100}),
    ]


async def test_paths_of_one_openapi_template_share_a_correction(
    make_tool, make_sidecar, make_llm, tmp_path: Path
):
    tool = await make_tool(size_tool({"/items/1": (1, 10), "/items/2": (1, 10)}))
    llm = await make_llm(fix({"size": 5}))
    openapi = tmp_path / "openapi.json"
    openapi.write_text(
        json.dumps(
            {
                "openapi": "3.1.0",
                "paths": {
                    "/items/{id}": {
                        "post": {
                            "requestBody": {
                                "content": {"application/json": {"schema": {"type": "object"}}}
                            }
                        }
                    }
                },
            }
        )
    )
    sidecar = await make_sidecar(
        routes=[{"name": "items", "prefix": "/", "upstream": tool.url, "schema": str(openapi)}],
        llm_base_url=llm.base_url,
    )

    first = await sidecar.client.post("/items/1", json={"size": 50})
    second = await sidecar.client.post("/items/2", json={"size": 50})

    assert (first.status, second.status) == (200, 200)
    assert len(llm.requests) == 1
    assert orjson.loads(tool.seen[-1].body) == {"size": 5}


async def test_another_error_message_is_another_failure(make_tool, make_sidecar, make_llm):
    def refusal(message: str):
        return lambda: web.json_response(
            {
                "success": False,
                "error": {"code": "BAD_SIZE", "message": message, "retryable": True},
            },
            status=400,
        )

    tool = await make_tool(
        scripted(
            refusal("size is out of range"),
            refusal("size is out of range"),
            refusal("size is reserved"),
        )
    )
    llm = await make_llm(fix({}, can_fix=False))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    for _ in range(3):
        response = await sidecar.client.post("/w", json={"size": 7})
        assert response.status == 400

    assert len(llm.requests) == 2


async def test_prose_is_sent_back_with_the_reason_and_the_second_answer_recovers(
    make_tool, make_sidecar, make_llm
):
    tool = await make_tool(location_tool())
    prose = "The location should be Flower Mound, Texas, US."
    llm = await make_llm(prose, fix({"location": CORRECT_CITY, "units": "metric"}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    with capture_logs() as logs:
        response = await sidecar.client.post(
            "/weather", json={"location": "Flower Mound, TX", "units": "metric"}
        )

    assert response.status == 200
    assert response.headers["X-Sidecar-Outcome"] == "recovered"
    assert response.headers["X-Sidecar-Trail"] == "404 repair=llm, 200"
    assert len(llm.requests) == 2
    first, second = (request["messages"] for request in llm.requests)
    assert second[: len(first)] == first  # the same conversation, carried on
    answered, reason = second[len(first) :]
    assert answered == {"role": "assistant", "content": prose}
    assert reason["role"] == "user"
    assert "refused: your answer is not JSON" in reason["content"]
    assert orjson.loads(tool.seen[1].body) == {"location": CORRECT_CITY, "units": "metric"}
    metric = sidecar.metric
    assert metric("sidecar_llm_requests_total", result="invalid") == 1
    assert metric("sidecar_llm_requests_total", result="ok") == 1
    assert metric("sidecar_repairs_total", route="default", layer="llm", result="reasked") == 1
    assert metric("sidecar_repairs_total", route="default", layer="llm", result="succeeded") == 1
    assert {
        "event": "llm_reask",
        "route": "default",
        "reason": "not_json",
        "log_level": "info",
    } in logs


ADDRESS_SCHEMA = {
    "type": "object",
    "required": ["address"],
    "properties": {
        "api_key": {"type": "string", "pattern": "^key-"},
        "address": {
            "type": "object",
            "required": ["city", "country"],
            "properties": {
                "city": {"type": "string"},
                "country": {"type": "string", "enum": ["US", "CA"]},
            },
        },
    },
}


def address_tool():
    async def geocode(request: web.Request) -> web.Response:
        address = (await request.json()).get("address")
        if address == {"city": "Flower Mound", "country": "US"}:
            return web.json_response({"success": True})
        return web.json_response(
            {
                "success": False,
                "error": {
                    "code": "BAD_ADDRESS",
                    "message": "address must be an object with city and country",
                    "category": "INPUT_ERROR",
                    "retryable": True,
                },
            },
            status=400,
        )

    return geocode


async def geocoder(make_tool, make_sidecar, llm, tmp_path: Path):
    """The address tool behind a sidecar whose route knows its schema, repairing with ``llm``."""
    tool = await make_tool(address_tool())
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(ADDRESS_SCHEMA))
    sidecar = await make_sidecar(
        routes=[{"name": "geo", "prefix": "/", "upstream": tool.url, "schema": str(schema)}],
        llm_base_url=llm.base_url,
    )
    return tool, sidecar


async def test_a_schema_refusal_tells_the_model_the_json_path_and_the_rule(
    make_tool, make_sidecar, make_llm, tmp_path: Path
):
    llm = await make_llm(
        fix({"address": {"city": "Flower Mound", "country": "USA"}}),
        fix({"address": {"city": "Flower Mound", "country": "US"}}),
    )
    tool, sidecar = await geocoder(make_tool, make_sidecar, llm, tmp_path)

    response = await sidecar.client.post("/geocode", json={"address": "Flower Mound, TX"})

    assert response.status == 200
    assert len(llm.requests) == 2
    reason = llm.requests[1]["messages"][-1]["content"]
    assert "corrected_payload does not fit the schema: $.address.country: " in reason
    assert "'USA' is not one of ['US', 'CA']" in reason
    assert sidecar.metric("sidecar_repairs_total", route="geo", layer="llm", result="reasked") == 1
    assert len(tool.seen) == 2, "the refused answer never reached the tool"


async def test_a_refusal_sent_back_to_the_model_holds_no_secret(
    make_tool, make_sidecar, make_llm, tmp_path: Path
):
    # The model keeps the placeholder it was given; the real key, put back, fails the
    # schema's pattern, and the reason must not quote it.
    answer = fix({"api_key": "<redacted-1>", "address": {"city": "Flower Mound", "country": "US"}})
    llm = await make_llm(answer)
    _, sidecar = await geocoder(make_tool, make_sidecar, llm, tmp_path)

    response = await sidecar.client.post(
        "/geocode", json={"api_key": "sk-live-4242", "address": "Flower Mound, TX"}
    )

    assert response.status == 400
    assert len(llm.requests) == 2
    reason = llm.requests[1]["messages"][-1]["content"]
    assert "$.api_key: '<redacted-1>' does not match '^key-'" in reason
    assert "sk-live-4242" not in json.dumps(llm.requests)


async def test_a_payload_already_tried_is_sent_back_as_such(make_tool, make_sidecar, make_llm):
    tool = await make_tool(location_tool())
    llm = await make_llm(fix({"location": "Flower Mound, TX"}), fix({"location": CORRECT_CITY}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 200
    assert (
        "corrected_payload is a payload already tried"
        in (llm.requests[1]["messages"][-1]["content"])
    )
    assert (
        sidecar.metric("sidecar_repairs_total", route="default", layer="llm", result="reasked") == 1
    )


async def test_no_reask_when_one_llm_call_is_allowed(make_tool, make_sidecar, make_llm):
    tool = await make_tool(location_tool())
    llm = await make_llm("not json", fix({"location": CORRECT_CITY}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, llm_max_repairs=1)

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 404
    assert response.headers["X-Sidecar-Trail"] == "404 repair=none"
    assert len(llm.requests) == 1
    assert (
        sidecar.metric("sidecar_repairs_total", route="default", layer="llm", result="reasked") == 0
    )
    assert (
        sidecar.metric("sidecar_repairs_total", route="default", layer="llm", result="failed") == 1
    )


async def test_reasks_and_repairs_share_the_requests_llm_calls(make_tool, make_sidecar, make_llm):
    tool = await make_tool(location_tool())
    llm = await make_llm(
        "prose", fix({"location": "Flower Mound, US"}), fix({"location": CORRECT_CITY})
    )
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, llm_max_repairs=2)

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    # The re-ask spent the second call; the tool's refusal of its answer gets no third.
    assert response.status == 404
    assert response.headers["X-Sidecar-Trail"] == "404 repair=llm, 404 repair=none"
    assert len(llm.requests) == 2


async def test_a_cached_answer_counts_as_one_of_the_requests_llm_repairs(
    make_tool, make_sidecar, make_llm
):
    tool = await make_tool(location_tool())
    llm = await make_llm(fix({}, can_fix=False, transient=True))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, llm_max_repairs=2)

    response = await sidecar.client.post("/w", json={"location": "Atlantis"})

    # Asked once, answered from the cache once; the third failure finds the cap reached.
    assert response.status == 404
    assert len(llm.requests) == 1
    assert len(tool.seen) == 3
    assert response.headers["X-Sidecar-Trail"].endswith(", 404 repair=none")


async def test_the_models_numbers_written_as_strings_are_coerced_to_the_schema(
    make_tool, make_sidecar, make_llm, tmp_path: Path
):
    point = {"type": "object", "properties": {"lat": {"type": "number"}}}
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps({"type": "object", "required": ["at"], "properties": {"at": point}})
    )

    async def places(request: web.Request) -> web.Response:
        if (await request.json()) == {"at": {"lat": 35.68}}:
            return web.json_response({"success": True})
        return web.json_response({"detail": "at: expected an object"}, status=422)

    tool = await make_tool(places)
    llm = await make_llm(fix({"at": {"lat": "35.68"}}))
    sidecar = await make_sidecar(
        routes=[{"name": "places", "prefix": "/", "upstream": tool.url, "schema": str(schema)}],
        llm_base_url=llm.base_url,
    )

    response = await sidecar.client.post("/places", json={"at": "35.68"})

    assert response.status == 200
    assert len(llm.requests) == 1
    # Only the changed value is rewritten; the agent's own spacing stays.
    assert tool.seen[1].body == b'{"at": {"lat":35.68}}'


async def test_a_payload_the_tool_refuses_is_told_to_the_model_in_the_same_conversation(
    make_tool, make_sidecar, make_llm
):
    tool = await make_tool(location_tool())
    first_answer = fix({"location": "Flower Mound, Texas", "units": "metric"})
    llm = await make_llm(first_answer, fix({"location": CORRECT_CITY, "units": "metric"}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post(
        "/weather", json={"location": "Flower Mound, TX", "units": "metric"}
    )

    assert response.status == 200
    assert response.headers["X-Sidecar-Trail"] == "404 repair=llm, 404 repair=llm, 200"
    first, second = (request["messages"] for request in llm.requests)
    assert second[: len(first)] == first
    answered, told = second[len(first) :]
    assert answered["role"] == "assistant"
    assert orjson.loads(answered["content"]) == first_answer
    assert told["role"] == "user"
    assert told["content"].startswith("The tool refused your corrected_payload too.")
    assert "City 'Flower Mound, Texas' not found" in told["content"]
    assert [orjson.loads(seen.body)["location"] for seen in tool.seen] == [
        "Flower Mound, TX",
        "Flower Mound, Texas",
        CORRECT_CITY,
    ]
    metric = sidecar.metric
    assert metric("sidecar_repairs_total", route="default", layer="llm", result="failed") == 1
    assert metric("sidecar_repairs_total", route="default", layer="llm", result="succeeded") == 1


async def test_no_secret_reaches_a_prompt_when_the_tool_echoes_it_in_a_later_refusal(
    make_tool, make_sidecar, make_llm
):
    async def echoing(request: web.Request) -> web.Response:
        payload = await request.json()
        if payload.get("location") == CORRECT_CITY:
            return web.json_response({"success": True})
        message = f"City '{payload['location']}' not found for key {payload['api_key']}"
        return web.json_response(
            {
                "success": False,
                "error": {
                    "code": "LOCATION_NOT_FOUND",
                    "message": message,
                    "category": "NOT_FOUND",
                    "retryable": True,
                },
            },
            status=404,
        )

    tool = await make_tool(echoing)
    llm = await make_llm(
        fix({"location": "Flower Mound, Texas", "api_key": "<redacted-1>"}),
        fix({"location": CORRECT_CITY, "api_key": "<redacted-1>"}),
    )
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post(
        "/weather",
        json={"location": "Flower Mound, TX", "api_key": "sk-live-77777777"},
        headers={"Authorization": "Bearer agent-secret-1"},
    )

    assert response.status == 200
    assert len(llm.requests) == 2
    prompts = json.dumps(llm.requests)
    assert "sk-live-77777777" not in prompts
    assert "agent-secret-1" not in prompts
    told = llm.requests[1]["messages"][-1]["content"]
    assert "not found for key <redacted-1>" in told
    assert [orjson.loads(seen.body)["api_key"] for seen in tool.seen] == ["sk-live-77777777"] * 3


async def test_the_prompt_leads_with_the_field_the_tool_refused_and_the_intent(
    make_tool, make_sidecar, make_llm
):
    go_error = "json: cannot unmarshal string into Go struct field PointRequest.lat of type float64"

    async def go_tool(request: web.Request) -> web.Response:
        payload = await request.json()
        if isinstance(payload.get("lat"), float):
            return web.json_response({"ok": True})
        return web.Response(text=go_error + "\n", status=400)

    tool = await make_tool(go_tool)
    llm = await make_llm(fix({"lat": 35.6, "lon": 139.7}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post(
        "/point",
        json={"lat": "35.6", "lon": 139.7},
        headers={"X-Sidecar-Intent": "Weather at 35.6 N, 139.7 E"},
    )

    assert response.status == 200
    prompt = llm.prompt()
    assert list(prompt)[:3] == ["fix", "user_intent", "failed_payload"]
    assert prompt["fix"] == [
        {
            "field": "lat",
            "sent": "35.6",
            "tool_says": go_error,
            "tool_wants": "a JSON number, without quotes",
        }
    ]
    assert prompt["user_intent"] == "Weather at 35.6 N, 139.7 E"


async def test_a_missing_field_is_named_as_missing(make_tool, make_sidecar, make_llm):
    async def search(request: web.Request) -> web.Response:
        if "near" in await request.json():
            return web.json_response({"success": True})
        return web.json_response(
            {
                "success": False,
                "error": {
                    "code": "MISSING_FIELD",
                    "message": "near is required: the place to search around",
                    "category": "INPUT_ERROR",
                    "retryable": True,
                },
            },
            status=400,
        )

    tool = await make_tool(search)
    llm = await make_llm(fix({"query": "tacos", "near": "Austin"}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post(
        "/search", json={"query": "tacos"}, headers={"X-Sidecar-Intent": "Tacos near Austin"}
    )

    assert response.status == 200
    assert llm.prompt()["fix"] == [
        {
            "field": "near",
            "missing_from_payload": True,
            "tool_says": "near is required: the place to search around",
        }
    ]


async def test_every_call_opens_with_the_same_worked_examples(make_tool, make_sidecar, make_llm):
    tool = await make_tool(location_tool())
    llm = await make_llm(fix({}, can_fix=False))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    await sidecar.client.post("/a", json={"location": "Flower Mound, TX"})
    await sidecar.client.post("/b", json={"location": "Atlantis", "units": "imperial"})

    first, second = (request["messages"] for request in llm.requests)
    # Alike up to the failure itself: a server that keeps its prompt cache reads them once.
    assert first[:-1] == second[:-1]
    assert first[-1] != second[-1]
    system, *examples = first[:-1]
    assert system["role"] == "system"
    assert [turn["role"] for turn in examples] == ["user", "assistant"] * (len(examples) // 2)
    for question, answer in zip(examples[::2], examples[1::2], strict=True):
        assert list(orjson.loads(question["content"]))[:3] == [
            "fix",
            "user_intent",
            "failed_payload",
        ]
        assert list(orjson.loads(answer["content"])) == [
            "analysis",
            "corrected_payload",
            "is_transient",
            "can_fix",
        ]
    assert "Flower Mound" not in json.dumps(examples)
