"""Traces to a real OTLP/HTTP receiver: the agent's call, each attempt, wait and repair."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from aiohttp import web

from sidecar.config import ConfigError, load_settings
from sidecar.serve.app import HOOKS, create_admin_app, create_app
from tests.otlp import ReceivedSpan, Receiver, start_receiver
from tests.test_hedging import hedged_tool

AGENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
AGENT_SPAN = "00f067aa0ba902b7"
AGENT_TRACEPARENT = f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"
SECRETS = (b"sk-agent-SECRET", b"QUERYSECRET", b"COOKIESECRET", b"sk-llm-SECRET", b"PAYLOADVALUE")


@pytest.fixture
async def receiver(aiohttp_server, monkeypatch) -> Receiver:
    """A receiver the sidecar exports to: tracing is on through the endpoint alone."""
    receiver = await start_receiver(aiohttp_server)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    return receiver


async def exported(sidecar) -> None:
    """Every span ended so far, sent to the receiver (the exporter blocks: off the loop)."""
    await asyncio.to_thread(sidecar.app[HOOKS].flush)


def unavailable_then_typed():
    """A Go-style tool: first overloaded, then a 400 while ``lat`` is a string, then 200."""
    calls = 0

    async def forecast(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        payload = await request.json()
        if calls == 1:
            return web.Response(status=503, text="busy")
        if not isinstance(payload.get("lat"), int | float):
            return web.Response(
                status=400,
                text="json: cannot unmarshal string into Go struct field "
                "Request.lat of type float64",
            )
        return web.json_response({"success": True})

    return forecast


def llm_fix(payload: dict) -> dict:
    return {
        "can_fix": True,
        "analysis": "lat must be a number",
        "corrected_payload": payload,
        "is_transient": False,
    }


async def recovered_request(make_tool, make_sidecar, make_llm):
    tool = await make_tool(unavailable_then_typed())
    llm = await make_llm(llm_fix({"lat": 35.6, "lon": 139.7, "note": "PAYLOADVALUE-1"}))
    sidecar = await make_sidecar(
        tool,
        llm_base_url=llm.base_url,
        llm_model="repair-model",
        llm_api_key="sk-llm-SECRET",
    )
    response = await sidecar.client.post(
        "/forecast?token=QUERYSECRET",
        json={"lat": "35.6", "lon": 139.7, "note": "PAYLOADVALUE-1"},
        headers={
            "traceparent": AGENT_TRACEPARENT,
            "Authorization": "Bearer sk-agent-SECRET",
            "Cookie": "session=COOKIESECRET",
        },
    )
    assert response.status == 200
    assert response.headers["X-Sidecar-Repaired"] == "llm"
    await exported(sidecar)
    return tool, sidecar


def only_server_span(receiver: Receiver) -> ReceivedSpan:
    servers = [span for span in receiver.spans if span.is_server]
    assert len(servers) == 1
    return servers[0]


async def test_a_recovered_request_is_one_server_span_with_its_attempts_wait_and_repair(
    receiver, make_tool, make_sidecar, make_llm
):
    tool, _ = await recovered_request(make_tool, make_sidecar, make_llm)

    server = only_server_span(receiver)
    assert (server.trace_id, server.parent_id) == (AGENT_TRACE, AGENT_SPAN)
    assert server.name == "POST default"
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["sidecar.outcome"] == "recovered"
    assert server.attributes["sidecar.attempts"] == 3
    assert server.attributes["sidecar.trail"].endswith("400 repair=llm, 200")
    assert server.resource["service.name"] == "tool-retry-sidecar"

    first, second, repair, third = receiver.children_of(server)
    assert [span.name for span in (first, second, repair, third)] == [
        "POST",
        "POST",
        "repair llm",
        "POST",
    ]
    assert all(span.is_client for span in (first, second, third))
    assert [span.attributes["sidecar.attempt"] for span in (first, second, third)] == [1, 2, 3]
    assert [span.attributes["http.response.status_code"] for span in (first, second, third)] == [
        503,
        400,
        200,
    ]
    assert first.attributes["sidecar.retry.reason"] == "server_error"
    assert second.attributes["sidecar.retry.reason"] == "repaired"
    assert "sidecar.retry.reason" not in third.attributes
    assert third.attributes["http.request.resend_count"] == 2

    # The wait comes after the first answer and before the second attempt.
    waits = [event for event in server.events if event[0] == "retry.wait"]
    assert len(waits) == 1
    _, waited_at, wait = waits[0]
    assert first.end_ns <= waited_at <= second.start_ns
    assert wait["sidecar.wait.source"] == "backoff"
    assert wait["sidecar.wait.seconds"] > 0
    assert second.end_ns <= repair.start_ns <= repair.end_ns <= third.start_ns

    assert repair.attributes["sidecar.repair.fields"] == ["lat"]
    assert [event[0] for event in repair.events] == ["validation_feedback.started"]
    assert "validation_feedback.succeeded" in [event[0] for event in server.events]
    (chat,) = receiver.children_of(repair)
    assert chat.name == "chat repair-model"
    assert chat.is_client
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.request.model"] == "repair-model"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 120
    assert chat.attributes["gen_ai.usage.output_tokens"] == 30

    # Each attempt reached the tool under its own span: the tool's spans hang there.
    assert [seen.headers["traceparent"] for seen in tool.seen] == [
        f"00-{AGENT_TRACE}-{attempt.span_id}-01" for attempt in (first, second, third)
    ]
    assert all(span.trace_id == AGENT_TRACE for span in receiver.spans)


async def test_no_secret_and_no_payload_value_in_any_exported_byte(
    receiver, make_tool, make_sidecar, make_llm
):
    await recovered_request(make_tool, make_sidecar, make_llm)

    assert receiver.bodies
    assert receiver.content_types == ["application/x-protobuf"] * len(receiver.bodies)
    for body in receiver.bodies:
        for secret in SECRETS:
            assert secret not in body


async def test_without_a_traceparent_the_request_starts_a_trace_the_tool_continues(
    receiver, make_tool, make_sidecar
):
    tool = await make_tool(lambda _: _ok())
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/items")
    assert response.status == 200
    await exported(sidecar)

    server = only_server_span(receiver)
    assert server.parent_id == ""
    (attempt,) = receiver.children_of(server)
    version, trace_id, span_id, flags = tool.seen[0].headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", server.trace_id, attempt.span_id)
    assert int(flags, 16) & 1  # sampled


async def _ok() -> web.Response:
    return web.json_response({"ok": True})


async def test_sampled_durations_carry_the_trace_id_in_openmetrics_only(
    receiver, make_tool, make_sidecar, make_llm, aiohttp_client
):
    _, sidecar = await recovered_request(make_tool, make_sidecar, make_llm)
    admin = await aiohttp_client(create_admin_app(sidecar.app))
    server = only_server_span(receiver)
    attempts = [span for span in receiver.spans if span.name == "POST"]

    openmetrics = await admin.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    text = await admin.get("/metrics")

    assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")
    exposition = await openmetrics.text()
    request_lines = [
        line
        for line in exposition.splitlines()
        if line.startswith("sidecar_request_duration_seconds_bucket") and " # " in line
    ]
    assert len(request_lines) == 1
    assert f'# {{span_id="{server.span_id}",trace_id="{AGENT_TRACE}"}}' in request_lines[0]
    upstream_exemplars = {
        line.split('span_id="')[1][:16]
        for line in exposition.splitlines()
        if line.startswith("sidecar_upstream_duration_seconds_bucket") and " # " in line
    }
    assert upstream_exemplars and upstream_exemplars <= {span.span_id for span in attempts}
    assert text.headers["Content-Type"].startswith("text/plain")
    assert "trace_id" not in await text.text()


async def test_off_the_agents_traceparent_goes_through_untouched_and_nothing_is_sent(
    receiver, make_tool, make_sidecar, monkeypatch
):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    tool = await make_tool(lambda _: _ok())
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/items", headers={"traceparent": AGENT_TRACEPARENT})
    assert response.status == 200
    # Closing the app is when a tracer would flush its last spans.
    await sidecar.client.close()

    assert tool.seen[0].headers["traceparent"] == AGENT_TRACEPARENT
    assert receiver.bodies == []


def _imports_the_sdk(environment: dict[str, str]) -> bool:
    program = (
        "import sys\n"
        "from sidecar.serve.app import create_app\n"
        "from sidecar.config import load_settings\n"
        "create_app(load_settings(upstream_url='http://127.0.0.1:9').served())\n"
        "print(any(name.startswith('opentelemetry') for name in sys.modules))\n"
    )
    clean = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    answer = subprocess.run(
        [sys.executable, "-c", program],
        env={**clean, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return answer.stdout.strip() == "True"


def test_the_sdk_is_imported_only_when_tracing_is_on():
    assert not _imports_the_sdk({})
    assert not _imports_the_sdk(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert _imports_the_sdk({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER: zipkin"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "grpc is not supported"),
    ],
)
def test_an_exporter_or_protocol_not_shipped_is_refused_at_startup(
    monkeypatch, variable, value, message
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=message):
        create_app(load_settings(upstream_url="http://127.0.0.1:9").served())
    checked = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "--upstream", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 2
    assert checked.stderr.splitlines() == [checked.stderr.strip()]
    assert message in checked.stderr


async def test_service_name_resource_and_sampler_come_from_the_standard_variables(
    receiver, make_tool, make_sidecar, monkeypatch
):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "weather-agent-sidecar")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    tool = await make_tool(lambda _: _ok())
    sidecar = await make_sidecar(tool)

    await sidecar.client.get("/items")
    await exported(sidecar)

    server = only_server_span(receiver)
    assert server.resource["service.name"] == "weather-agent-sidecar"
    assert server.resource["deployment.environment.name"] == "staging"


async def test_a_trace_sampled_out_exports_nothing_but_still_reaches_the_tool(
    receiver, make_tool, make_sidecar, monkeypatch
):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tool = await make_tool(lambda _: _ok())
    sidecar = await make_sidecar(tool)

    await sidecar.client.get("/items", headers={"traceparent": AGENT_TRACEPARENT[:-2] + "00"})
    await sidecar.client.close()

    assert receiver.bodies == []
    version, trace_id, span_id, flags = tool.seen[0].headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", AGENT_TRACE, "00")
    assert span_id != AGENT_SPAN


async def test_a_hedge_is_its_own_client_span_and_the_loser_is_marked_cancelled(
    receiver, make_tool, make_sidecar
):
    tool, slow = await hedged_tool(make_tool)
    sidecar = await make_sidecar(tool, hedge_after_ms=50)

    answer = await sidecar.client.get("/search")
    assert answer.status == 200
    await asyncio.wait_for(slow.first_dropped.wait(), timeout=5)
    await exported(sidecar)

    server = only_server_span(receiver)
    first, hedge = receiver.children_of(server)
    assert [span.attributes["sidecar.attempt"] for span in (first, hedge)] == [1, 2]
    assert first.attributes["sidecar.hedge.cancelled"] is True
    assert hedge.attributes["sidecar.hedge"] is True
    assert hedge.attributes["http.response.status_code"] == 200
    assert ("hedge.finished", {"sidecar.hedge.result": "won"}) in [
        (name, attributes) for name, _, attributes in server.events
    ]
