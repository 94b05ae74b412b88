"""The live page on the admin port, read over plain HTTP: what ``/ui/state.json`` says after
real calls through the sidecar, what it never says, its files, and ``SIDECAR_UI=off``.

The page itself, in a real browser, is in ``test_live_page_browser.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from sidecar.serve.app import HOOKS, create_admin_app
from sidecar.telemetry.events import RequestFinished
from sidecar.telemetry.recent import RecentCalls, tool_answered
from tests.conftest import FakeClock, scripted

# Recognisable values the agent sends that must never reach the page.
BEARER_TOKEN = "sk-live-7d1e0c55a9b04e2f"
QUERY_SECRET = "qs-4b9f2a61c3d8"
PAYLOAD_VALUE = "pv-Reykjavik-93c1e7"
# A number sent as a string, which the route's schema coerces: "lat" is shown, never this.
COORDINATE = "48.85837"
SECRETS = (BEARER_TOKEN, QUERY_SECRET, PAYLOAD_VALUE, COORDINATE)


def flaky_tool():
    """Each call is answered 503 first, then 200."""
    answered = 0

    async def handler(_: web.Request) -> web.Response:
        nonlocal answered
        answered += 1
        if answered % 2:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"success": True})

    return handler


async def ok(_: web.Request) -> web.Response:
    return web.json_response({"success": True})


def weather_routes(flaky_url: str, ok_url: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``weather`` (``lat`` must be a number) to the flaky tool, ``quiet`` to the ok one."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"lat": {"type": "number"}}}))
    return [
        {"name": "weather", "prefix": "/weather", "upstream": flaky_url, "schema": str(schema)},
        {"name": "quiet", "prefix": "/quiet", "upstream": ok_url},
    ]


async def call_with_secrets(client: Any) -> Any:
    """A call carrying a secret in its Authorization header, its query and its payload."""
    return await client.post(
        f"/weather/current?api_key={QUERY_SECRET}&units=metric",
        json={"city": PAYLOAD_VALUE, "lat": COORDINATE},
        headers={"Authorization": f"Bearer {BEARER_TOKEN}"},
    )


async def read_state(admin: Any) -> tuple[dict[str, Any], str]:
    answer = await admin.get("/ui/state.json")
    assert answer.status == 200
    text = await answer.text()
    return json.loads(text), text


def by_name(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {route["name"]: route for route in state["routes"]}


async def test_the_state_counts_each_route_and_lists_the_calls_worth_a_look(
    make_tool, make_sidecar, aiohttp_client, tmp_path
):
    flaky, quiet = await make_tool(flaky_tool()), await make_tool(ok)
    sidecar = await make_sidecar(routes=weather_routes(flaky.url, quiet.url, tmp_path))
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    recovered = await call_with_secrets(sidecar.client)
    assert (await sidecar.client.get("/quiet/today")).status == 200
    assert (await sidecar.client.get("/nowhere")).status == 404
    state, text = await read_state(admin)

    assert recovered.headers["X-Sidecar-Outcome"] == "recovered"
    routes = by_name(state)
    assert list(routes) == ["weather", "quiet", "(none)"]
    assert {key: routes["weather"][key] for key in ("calls", "ok", "recovered", "gave_up")} == {
        "calls": 1,
        "ok": 0,
        "recovered": 1,
        "gave_up": 0,
    }
    assert routes["weather"]["circuits"] == [
        {"tool": "/weather/current", "state": "closed", "probe_in_s": 0.0}
    ]
    assert routes["weather"]["cooldowns"] == []
    # 0.2 of 1 request, plus 10 a second over the 10 s window, less the 1 retry made.
    assert routes["weather"]["budget_left"] == 99
    assert routes["quiet"]["ok"] == 1 and routes["quiet"]["calls_per_s"] > 0
    assert routes["(none)"]["gave_up"] == 1 and routes["(none)"]["budget_left"] is None
    # Newest first; the first-attempt success on "quiet" is counted, not listed.
    unmatched, weather = state["calls"]
    assert (unmatched["route"], unmatched["path"], unmatched["status"]) == (
        "(none)",
        "/nowhere",
        404,
    )
    assert weather["number"] < unmatched["number"]
    assert {key: weather[key] for key in ("route", "method", "path", "outcome", "status")} == {
        "route": "weather",
        "method": "POST",
        "path": "/weather/current",
        "outcome": "recovered",
        "status": 200,
    }
    assert weather["attempts"] == 2 and weather["duration_ms"] > 0
    assert weather["trail"] == recovered.headers["X-Sidecar-Trail"].split(", ")
    assert weather["repairs"] == [{"layer": "coercion", "fields": ["lat"]}]
    for secret in (*SECRETS, "api_key", "Bearer"):
        assert secret not in text


async def test_the_ring_keeps_the_last_200_calls(make_tool, make_sidecar, aiohttp_client):
    async def not_found(_: web.Request) -> web.Response:
        return web.json_response({"error": "no such city"}, status=404)

    sidecar = await make_sidecar(await make_tool(not_found))
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    for number in range(205):
        assert (await sidecar.client.get(f"/city/{number}")).status == 404
    state, _ = await read_state(admin)

    assert [call["path"] for call in state["calls"]] == [
        f"/city/{number}" for number in range(204, 4, -1)
    ]
    assert {key: by_name(state)["default"][key] for key in ("answered", "gave_up")} == {
        "answered": 205,
        "gave_up": 0,
    }
    assert {call["answered"] for call in state["calls"]} == {True}


@pytest.mark.parametrize(
    ("outcome", "status", "attempts", "trail", "answered"),
    [
        ("not-retryable", 400, 1, "400", True),  # an SDK's probe the server does not serve
        ("not-retryable", 404, 1, "404", True),
        ("not-retryable", 401, 1, "401", True),
        ("not-retryable", 400, 1, "400 repair=none", False),  # a repair was looked for
        ("not-retryable", 400, 2, "503 backoff=0.1s, 400", False),  # after a retry
        ("not-retryable", 503, 1, "503 stop=not_replayable", False),
        ("not-retryable", 500, 1, "500", False),  # a 5xx is the tool failing
        ("not-retryable", 413, 0, "", False),  # the sidecar's own answer
        ("exhausted", 429, 4, "429 backoff=0.1s, 429 backoff=0.2s, 429 backoff=0.4s, 429", False),
        ("ok", 200, 1, "200", False),
    ],
)
def test_which_calls_are_the_tool_s_answer_rather_than_a_give_up(
    outcome, status, attempts, trail, answered
):
    event = RequestFinished("r", "POST", "/mcp", outcome, status, attempts, 0.01, trail, True, None)
    assert tool_answered(event) is answered


async def test_a_session_s_probe_answered_400_is_counted_answered_and_keeps_its_metric(
    make_tool, make_sidecar, aiohttp_client
):
    """An MCP SDK's first call, ``server/discover``, answered 400 by a server that does not
    serve it, then a successful call: nothing gave up, and the probe's refusal is its answer
    (``ok``; 0.5 counted it ``not-retryable``). A 503 the sidecar spent its retries on still
    gave up."""

    async def mcp_server(request: web.Request) -> web.Response:
        method = (await request.json()).get("method")
        if method == "server/discover":
            error = {"code": -32600, "message": "Bad Request: unsupported protocol version"}
            return web.json_response({"jsonrpc": "2.0", "id": 1, "error": error}, status=400)
        if method == "tools/call":
            return web.json_response({"jsonrpc": "2.0", "id": 2, "result": {"content": []}})
        return web.json_response({"error": "down"}, status=503)

    sidecar = await make_sidecar(await make_tool(mcp_server), max_retries=1)
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    probe = await sidecar.client.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "server/discover"}
    )
    call = await sidecar.client.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
    )
    down = await sidecar.client.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "ping"})
    state, _ = await read_state(admin)

    assert [probe.status, call.status, down.status] == [400, 200, 503]
    counts = by_name(state)["default"]
    assert {key: counts[key] for key in ("calls", "ok", "recovered", "answered", "gave_up")} == {
        "calls": 3,
        "ok": 2,
        "recovered": 0,
        "answered": 0,
        "gave_up": 1,
    }
    [exhausted] = state["calls"]
    assert (exhausted["outcome"], exhausted["answered"]) == ("exhausted", False)
    requests = "sidecar_requests_total"
    assert sidecar.metric(requests, route="default", method="POST", outcome="ok") == 2
    assert sidecar.metric(requests, route="default", method="POST", outcome="not-retryable") == 0


async def test_each_tool_shows_its_circuit_an_open_one_first_with_the_time_to_its_probe(
    make_tool, make_sidecar, aiohttp_client
):
    async def forecast_down(request: web.Request) -> web.Response:
        if request.path == "/forecast":
            return web.json_response({"error": "down"}, status=503)
        return web.json_response({"success": True})

    clock = FakeClock()
    sidecar = await make_sidecar(
        await make_tool(forecast_down),
        clock=clock,
        max_retries=0,
        circuit_failures=1,
        circuit_min_calls=0,
    )
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    assert (await sidecar.client.get("/status")).status == 200
    assert (await sidecar.client.get("/forecast")).headers["X-Sidecar-Outcome"] == "exhausted"
    opened, _ = await read_state(admin)
    clock.now += 10
    later, _ = await read_state(admin)

    assert by_name(opened)["default"]["circuits"] == [
        {"tool": "/forecast", "state": "open", "probe_in_s": 30.0},
        {"tool": "/status", "state": "closed", "probe_in_s": 0.0},
    ]
    assert by_name(later)["default"]["circuits"][0]["probe_in_s"] == 20.0
    assert by_name(later)["default"]["budget_left"] == 100
    assert opened["calls"][0]["trail"] == ["503 stop=exhausted"]


async def test_a_cooldown_the_tool_asked_for_is_shown_with_its_time_left(
    make_tool, make_sidecar, aiohttp_client, redis_store
):
    async def rate_limited(_: web.Request) -> web.Response:
        return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "30"})

    clock = FakeClock()
    sidecar = await make_sidecar(
        await make_tool(rate_limited),
        clock=clock,
        state_url=redis_store.url,
        state_timeout_ms=2000,
        max_retry_after_ms=1000,
    )
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    assert (await sidecar.client.get("/forecast")).status == 429
    state, _ = await read_state(admin)

    # The tool's Retry-After header holds back the whole tool, whatever the path.
    assert by_name(state)["default"]["cooldowns"] == [
        {"tool": "/forecast", "path": "", "left_s": 30.0}
    ]


async def test_the_page_and_its_files_come_from_the_admin_port_alone(
    make_tool, make_sidecar, aiohttp_client
):
    sidecar = await make_sidecar(await make_tool(ok))
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    page = await admin.get("/ui")
    html = await page.text()
    files = {name: await admin.get(f"/ui/{name}") for name in ("ui.js", "ui.css")}
    slash = await admin.get("/ui/")

    assert page.status == 200 and page.content_type == "text/html"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "Server" not in page.headers
    assert set(re.findall(r'(?:src|href)="([^"]+)"', html)) == {"ui/ui.js", "ui/ui.css"}
    assert files["ui.js"].content_type == "text/javascript"
    assert files["ui.css"].content_type == "text/css"
    for text in (html, *[await answer.text() for answer in files.values()]):
        assert not re.search(r"https?:|url\(|@import", text)
    assert slash.status == 200 and slash.url.path == "/ui"
    assert (await admin.get("/ui/other.js")).status == 404


async def test_sidecar_ui_off_answers_404_and_records_nothing(
    make_tool, make_sidecar, aiohttp_client, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SIDECAR_UI", "off")
    sidecar = await make_sidecar(await make_tool(ok))
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    answers = [await admin.get(path) for path in ("/ui", "/ui/state.json", "/ui/ui.js")]

    assert [answer.status for answer in answers] == [404, 404, 404]
    assert (await admin.get("/metrics")).status == 200
    assert not any(isinstance(sink, RecentCalls) for sink in sidecar.app[HOOKS].sinks)


@pytest.mark.parametrize(
    "path",
    [
        "/r/fetch/user:us-9f3c2e@h.example/x",
        "/r/fetch/https%3A%2F%2Fuser%3Aus-9f3c2e%40h.example%2Fx",
        "/r/fetch/user%253Aus-9f3c2e%2540h.example/x",
    ],
    ids=["bare", "escaped-once", "escaped-twice"],
)
async def test_a_credential_in_a_path_reaches_no_label_page_or_log_line(
    make_tool, make_sidecar, aiohttp_client, path
):
    """The tool's circuit is named by its path: the credential there is masked in the
    circuit's label, on the live page and in every log line, at debug too."""
    failing = await make_tool(scripted(lambda: web.json_response({}, status=503)))
    sidecar = await make_sidecar(failing, max_retries=0)
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    with capture_logs() as logs:
        await sidecar.client.get(path)
    _, page = await read_state(admin)
    metrics = await (await admin.get("/metrics")).text()

    assert "us-9f3c2e" not in page
    assert "us-9f3c2e" not in metrics and 'tool="/r/fetch/' in metrics
    assert "us-9f3c2e" not in json.dumps(logs, default=str)
