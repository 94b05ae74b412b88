"""What the process writes to its log: every line through one chain, never a credential."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import signal
import subprocess
import sys

import aiohttp
import pytest
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.credentials import mask_credentials, mask_path
from sidecar.telemetry import build_hooks
from sidecar.telemetry.logs import CIRCUIT_REFUSALS_INTERVAL_S
from sidecar.telemetry.metric_definitions import Metrics
from tests.conftest import FakeClock, completion, scripted, unused_port
from tests.processes import clean_env, sidecar_process


@pytest.mark.security
@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (
            "HTTP Request: POST http://user:pa55@llm.local/v1/chat?api-key=k3y&x=1 200",
            "HTTP Request: POST http://***@llm.local/v1/chat?api-key=***&x=1 200",
        ),
        ("https://u:p@ss:w@host:8080/", "https://***@host:8080/"),
        ("wss://token@host/socket", "wss://***@host/socket"),
        ("/a?api_key=1&apikey=2&key=3&Token=4", "/a?api_key=***&apikey=***&key=***&Token=***"),
        (
            "?access_token=a&refresh_token=b&client_secret=c",
            "?access_token=***&refresh_token=***&client_secret=***",
        ),
        (
            "?X-Amz-Signature=s&X-Amz-Credential=c&X-Amz-Security-Token=t",
            "?X-Amz-Signature=***&X-Amz-Credential=***&X-Amz-Security-Token=***",
        ),
        (
            "?sig=s&signature=t&password=p&pwd=q&secret=r&code=c&appid=a",
            "?sig=***&signature=***&password=***&pwd=***&secret=***&code=***&appid=***",
        ),
        ("'http://h/x?x-api-key=abc'", "'http://h/x?x-api-key=***'"),
        ("Authorization: Bearer sk-abcdef123", "Authorization: Bearer ***"),
        # Words that merely end like a credential name, and URLs without one, stay.
        ("?monkey=1&keyboard=2&country_code=US", "?monkey=1&keyboard=2&country_code=US"),
        (
            "mail me@example.com about http://host/path",
            "mail me@example.com about http://host/path",
        ),
    ],
)
def test_credentials_in_text_are_masked(text: str, masked: str):
    assert mask_credentials(text) == masked


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/weather/current", "/weather/current"),
        ("/weather/caf%C3%A9/x%2Fy", "/weather/caf%C3%A9/x%2Fy"),  # no credential: as sent
        ("/weather/x;access_token=s1", "/weather/x;access_token=***"),
        ("/weather/key=s2", "/weather/key=***"),
        ("/weather/x%3Ftoken%3Ds3", "/weather/x?token=***"),
        ("/weather/a%3Bsessionid%3Ds4/b", "/weather/a;sessionid=***"),  # to the value's end
        ("/weather/https%3A%2F%2Fuser:s5@host/x", "/weather/https://***@host/x"),
        ("/weather/https://user:s6@host/x", "/weather/https://***@host/x"),
        ("/weather/x%20Bearer%20abcdef123", "/weather/x Bearer ***"),
    ],
)
def test_a_path_is_shown_as_sent_or_decoded_with_its_credentials_masked(path: str, shown: str):
    assert mask_path(path) == shown


# Each form a URL's userinfo takes in a path: with a scheme and without (0.5 showed the
# second in circuit labels, the live page and the access log), as it came, escaped once and
# escaped twice.
USERINFO_FORMS = [
    ("/r/fetch/https://user:SECRET@h.example/x", "/r/fetch/https://***@h.example/x"),
    ("/r/fetch/user:SECRET@h.example/x", "/r/fetch/***@h.example/x"),
    ("/r/fetch/:SECRET@h.example/x", "/r/fetch/***@h.example/x"),
    ("/r/fetch/https%3A%2F%2Fuser%3ASECRET%40h.example%2Fx", "/r/fetch/https://***@h.example/x"),
    ("/r/fetch/user%3ASECRET%40h.example/x", "/r/fetch/***@h.example/x"),
    (
        "/r/fetch/https%253A%252F%252Fuser%253ASECRET%2540h.example",
        "/r/fetch/https://***@h.example",
    ),
    ("/r/fetch/user%253ASECRET%2540h.example/x", "/r/fetch/***@h.example/x"),
    ("/r/f/x%253Ftoken%253DSECRET", "/r/f/x?token=***"),
    # A user that is an escaped address, a password holding an "@", an IPv6 host
    ("/r/fetch/alice%40corp.example:SECRET@h.example/x", "/r/fetch/***@h.example/x"),
    ("/r/fetch/user:SE@CRET@h.example/x", "/r/fetch/***@h.example/x"),
    ("/r/fetch/user:SECRET@[::1]:8080/x", "/r/fetch/***@[::1]:8080/x"),
    ("/r/fetch/user:SECRET@_h.example/x", "/r/fetch/***@_h.example/x"),
    # Not credentials: an address, a time, a colon in a segment
    ("/users/alice@example.com", "/users/alice@example.com"),
    ("/at/12:30", "/at/12:30"),
    ("/a:b/c", "/a:b/c"),
]


@pytest.mark.parametrize(("path", "shown"), USERINFO_FORMS)
def test_every_userinfo_form_in_a_path_is_masked(path: str, shown: str):
    assert mask_path(path) == shown


LOG_SCRIPT = """
import logging, sys, warnings
import structlog
from sidecar.telemetry.logging_setup import configure_logging

configure_logging(sys.argv[1], "json")
url = "http://agent:{password}@llm.local/v1?api-key={key}"
for name in ("httpx", "httpcore.http11", "openai._base_client", "aiohttp.client", "asyncio"):
    logging.getLogger(name).debug("debug %s %s", name, url)
    logging.getLogger(name).info("info %s %s", name, url)
    logging.getLogger(name).warning("warning %s %s", name, url, extra={{"target": url}})
try:
    raise ConnectionError("cannot reach " + url)
except ConnectionError:
    logging.getLogger("httpx").exception("failed")
    structlog.get_logger("sidecar").exception("own_failure", url=url, api_key="{key}")
structlog.get_logger("sidecar").info("own_event", target=url, nested={{"urls": [url]}})
warnings.warn("deprecated " + url)
"""

PASSWORD, QUERY_KEY = "pw-4f1c9e", "qk-82d7b0"


def logged_lines(level: str) -> list[dict]:
    """What a process that configured logging at ``level`` wrote, stdout and stderr."""
    result = subprocess.run(
        [sys.executable, "-c", LOG_SCRIPT.format(password=PASSWORD, key=QUERY_KEY), level],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for secret in (PASSWORD, QUERY_KEY):
        assert secret not in result.stdout
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.security
@pytest.mark.parametrize("level", ["debug", "info"])
def test_library_lines_are_json_from_warning_up_and_masked(level: str):
    lines = logged_lines(level)

    library = [line for line in lines if line.get("logger", "sidecar") != "sidecar"]
    assert {line["level"] for line in library} == {"warning", "error"}
    warnings_by_logger = {line["logger"]: line for line in library if line["level"] == "warning"}
    assert set(warnings_by_logger) >= {"httpx", "httpcore.http11", "openai._base_client"}
    httpx = warnings_by_logger["httpx"]
    assert httpx["event"] == "warning httpx http://***@llm.local/v1?api-key=***"
    assert httpx["target"] == "http://***@llm.local/v1?api-key=***"
    [failed] = [line for line in library if line["event"] == "failed"]
    assert "ConnectionError: cannot reach http://***@llm.local" in failed["exception"]
    assert warnings_by_logger["py.warnings"]["event"].count("http://***@llm.local") == 1

    [own_failure] = [line for line in lines if line["event"] == "own_failure"]
    assert own_failure["api_key"] == "***"
    assert "cannot reach http://***@" in own_failure["exception"]
    [own_event] = [line for line in lines if line["event"] == "own_event"]
    assert own_event["nested"] == {"urls": ["http://***@llm.local/v1?api-key=***"]}


TOOL_PASSWORD, LLM_PASSWORD, LLM_QUERY_KEY, LLM_API_KEY = (
    "tool-pw-63a1",
    "llm-pw-0b9e",
    "llm-query-key-d27c",
    "sk-llm-api-key-5e40",
)


@pytest.mark.security
async def test_llm_repair_at_debug_writes_no_credential(aiohttp_server):
    async def weather(request: web.Request) -> web.Response:
        if (await request.json()).get("location") == "Flower Mound, Texas, US":
            return web.json_response({"success": True})
        return web.json_response(
            {
                "success": False,
                "error": {"code": "LOCATION_NOT_FOUND", "category": "NOT_FOUND", "retryable": True},
            },
            status=404,
        )

    llm_calls: list[web.Request] = []

    async def chat(request: web.Request) -> web.Response:
        llm_calls.append(request)
        if len(llm_calls) > 1:
            # A gateway that echoes what it was sent in its error.
            return web.json_response(
                {"error": {"message": f"bad key {request.query_string} {request.headers}"}},
                status=401,
            )
        return completion(
            json.dumps(
                {"can_fix": True, "corrected_payload": {"location": "Flower Mound, Texas, US"}}
            )
        )

    tool_app, llm_app = web.Application(), web.Application()
    tool_app.router.add_post("/weather", weather)
    llm_app.router.add_post("/v1/chat/completions", chat)
    tool, llm = await aiohttp_server(tool_app), await aiohttp_server(llm_app)
    tool_url = f"http://agent:{TOOL_PASSWORD}@127.0.0.1:{tool.port}/"
    llm_url = f"http://gateway:{LLM_PASSWORD}@127.0.0.1:{llm.port}/v1?api-key={LLM_QUERY_KEY}"
    env = {
        "SIDECAR_LOG_LEVEL": "debug",
        "SIDECAR_LLM_BASE_URL": llm_url,
        "SIDECAR_LLM_API_KEY": LLM_API_KEY,
    }

    async with sidecar_process(tool_url, env) as sidecar:
        exit_code = asyncio.create_task(sidecar.read_lines_until_exit())
        async with aiohttp.ClientSession() as agent:
            repaired = await agent.post(f"{sidecar.proxy}/weather", json={"location": "FM"})
            refused = await agent.post(f"{sidecar.proxy}/weather", json={"location": "Atlantis"})
        sidecar.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(exit_code, timeout=10) == 0

    assert repaired.headers["X-Sidecar-Trail"] == "404 repair=llm, 200"
    assert refused.status == 404
    # The query reached the model's endpoint as a query, with the path intact.
    assert [call.path for call in llm_calls] == ["/v1/chat/completions"] * 2
    assert llm_calls[0].query["api-key"] == LLM_QUERY_KEY
    output = "".join(sidecar.lines)
    basic = base64.b64encode(f"gateway:{LLM_PASSWORD}".encode()).decode()
    for secret in (TOOL_PASSWORD, LLM_PASSWORD, LLM_QUERY_KEY, LLM_API_KEY, basic):
        assert secret not in output
    events = [json.loads(line)["event"] for line in sidecar.lines]
    assert {"upstream_attempt", "payload_repaired", "llm_request_failed"} <= set(events)


def ok_answer() -> web.Response:
    return web.json_response({"success": True})


def events_named(logs: list[dict], event: str) -> list[dict]:
    return [entry for entry in logs if entry["event"] == event]


def not_found_tool():
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(
            {"success": False, "error": {"code": "CITY_UNKNOWN", "retryable": True}}, status=404
        )

    return handler


async def test_request_events_carry_the_path_without_its_query(make_tool, make_sidecar):
    tool = await make_tool(scripted(lambda: web.json_response({}, status=503), ok_answer))
    sidecar = await make_sidecar(tool)

    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        await sidecar.client.get("/weather/current?key=k-83f1&city=Oslo")

    [scheduled] = events_named(logs, "retry_scheduled")
    [recovered] = events_named(logs, "recovery_succeeded")
    assert scheduled["path"] == recovered["path"] == "/weather/current"
    assert "k-83f1" not in json.dumps(logs)


@pytest.mark.parametrize(
    ("answer", "result", "fields"),
    [
        (
            lambda: web.json_response({"error": "no such model"}, status=404),
            "error",
            {"status": 404, "error": "NotFoundError"},
        ),
        ("not json", "invalid", {"error": "Refused", "reason": "your answer is not JSON"}),
    ],
    ids=["404", "unusable answer"],
)
async def test_llm_failures_say_what_failed(
    make_tool, make_sidecar, make_llm, answer, result, fields
):
    async def respond() -> web.Response:
        return answer()

    llm = await make_llm(respond if callable(answer) else answer)
    # One call: a refused answer would otherwise be sent back once, and fail again.
    sidecar = await make_sidecar(
        await make_tool(not_found_tool()), llm_base_url=llm.base_url, llm_max_repairs=1
    )

    with capture_logs() as logs:
        await sidecar.client.post("/w", json={"city": "Atlantis"})

    [failed] = events_named(logs, "llm_request_failed")
    assert failed == {
        "event": "llm_request_failed",
        "log_level": "warning",
        "result": result,
        **fields,
    }


async def test_an_llm_that_is_down_is_named_by_its_error(make_tool, make_sidecar):
    sidecar = await make_sidecar(
        await make_tool(not_found_tool()), llm_base_url=f"http://127.0.0.1:{unused_port()}/v1"
    )

    with capture_logs() as logs:
        await sidecar.client.post("/w", json={"city": "Atlantis"})

    [failed] = events_named(logs, "llm_request_failed")
    assert (failed["result"], failed["error"]) == ("error", "APIConnectionError")
    assert "status" not in failed


async def test_a_repair_that_found_nothing_is_a_failed_recovery(make_tool, make_sidecar):
    sidecar = await make_sidecar(await make_tool(not_found_tool()), repair="deterministic")

    with capture_logs() as logs:
        response = await sidecar.client.post("/w", json={"city": "Atlantis"})

    assert response.headers["X-Sidecar-Trail"] == "404 repair=none"
    [failed] = events_named(logs, "recovery_failed")
    assert (failed["log_level"], failed["outcome"], failed["trail"]) == (
        "info",
        "not-retryable",
        "404 repair=none",
    )


async def test_a_plain_not_retryable_answer_is_no_failed_recovery(make_tool, make_sidecar):
    forbidden = scripted(lambda: web.json_response({}, status=403))
    sidecar = await make_sidecar(await make_tool(forbidden))

    with capture_logs() as logs:
        assert (await sidecar.client.get("/")).status == 403

    assert events_named(logs, "recovery_failed") == []
    # Still one line says how it ended: 0.5 wrote none at info.
    [done] = events_named(logs, "request_done")
    assert (done["log_level"], done["outcome"], done["status"], done["trail"]) == (
        "info",
        "not-retryable",
        403,
        "403",
    )


def test_circuit_refusals_are_one_line_per_interval_with_their_count():
    clock = FakeClock()
    hooks = build_hooks(Metrics(CollectorRegistry()), clock=clock)

    with capture_logs() as logs:
        for _ in range(500):
            hooks.circuit_refused("weather")
            hooks.request_finished("weather", "GET", "unreachable", 503, 0, 0.0)
            clock.now += 0.01  # 500 refusals over 5 s
        hooks.circuit_refused("search")
        clock.now += CIRCUIT_REFUSALS_INTERVAL_S
        hooks.circuit_refused("weather")
        for _ in range(3):  # half-open: a probe is out, the others are still refused
            hooks.circuit_state("weather", 1)
            hooks.circuit_refused("weather")
        hooks.circuit_state("weather", 0)  # closed: what is left is logged now
        hooks.circuit_state("weather", 0)

    refusals = [
        (entry["route"], entry["count"]) for entry in events_named(logs, "circuit_refusals")
    ]
    assert refusals == [("weather", 1), ("search", 1), ("weather", 500), ("weather", 3)]
    assert events_named(logs, "recovery_failed") == []
    # The refusals' own lines say it: none of a line each at info.
    assert [e for e in events_named(logs, "request_done") if e["log_level"] == "info"] == []


@pytest.mark.parametrize(
    ("level", "access_log", "lines"),
    [
        ("info", False, []),
        ("info", True, ["request_done"]),
        ("debug", False, ["request_received", "upstream_attempt", "request_done"]),
    ],
)
def test_a_plain_request_writes_its_debug_lines_only_at_debug(level, access_log, lines):
    hooks = build_hooks(Metrics(CollectorRegistry()), access_log=access_log)
    configured = structlog.get_config()["wrapper_class"]
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper()))
    )
    try:
        with capture_logs() as logs:
            hooks.request_received("weather", "GET")
            hooks.attempt_finished("weather", 1, "200", 0.01, None)
            hooks.request_finished("weather", "GET", "ok", 200, 1, 0.01)
    finally:
        structlog.configure(wrapper_class=configured)

    assert [entry["event"] for entry in logs] == lines
