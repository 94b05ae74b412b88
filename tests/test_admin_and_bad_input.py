"""The admin endpoints, and requests no proxy should choke on."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web

from sidecar import __version__
from sidecar.serve.admin_host import admin_host_allowed
from sidecar.serve.app import create_admin_app
from tests.conftest import BUILD_UNDER_TEST
from tests.rawhttp import raw_exchange


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"success": True, "seen": dict(request.headers)})


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:9464", True),  # a scrape or a probe by the pod's IP
        ("10.42.0.17", True),
        ("[::1]:9464", True),
        ("[fe80::1]", True),
        ("localhost", True),
        ("LOCALHOST:9464", True),
        ("sidecar-admin.monitoring.svc:9464", True),  # named in the setting
        ("attacker.example", False),  # DNS rebinding: a page's own name
        ("attacker.example:9464", False),
        ("127.0.0.1.attacker.example", False),
        ("localhost.attacker.example", False),
        ("::1", False),  # a v6 literal in Host needs its brackets
        ("[::1]x", False),
        ("[::1", False),
        ("127.0.0.1:x", False),
        ("", False),
        (None, False),
    ],
)
def test_the_admin_port_answers_ip_literals_localhost_and_named_hosts(host, allowed):
    assert admin_host_allowed(host, frozenset({"sidecar-admin.monitoring.svc"})) is allowed


async def test_an_admin_request_for_another_host_gets_421_and_no_state(
    make_tool, make_sidecar, aiohttp_client
):
    sidecar = await make_sidecar(
        await make_tool(ok), admin_allowed_hosts="Metrics.Internal, other.internal"
    )
    admin = await aiohttp_client(create_admin_app(sidecar.app))
    await (await sidecar.client.get("/a")).read()

    for path in ("/metrics", "/ui/state.json", "/healthz", "/ui"):
        refused = await admin.get(path, headers={"Host": "attacker.example"})
        assert refused.status == 421
        assert await refused.read() == b""
    named = await admin.get("/metrics", headers={"Host": "metrics.internal:9464"})
    assert named.status == 200
    assert "sidecar_requests_total" in await named.text()
    by_address = await admin.get("/ui/state.json")  # the test client's Host: 127.0.0.1:port
    assert by_address.status == 200


async def test_metrics_and_health_endpoints(make_tool, make_sidecar, aiohttp_client):
    sidecar = await make_sidecar(await make_tool(ok))
    admin = await aiohttp_client(create_admin_app(sidecar.app))
    await (await sidecar.client.get("/a")).read()

    metrics = await admin.get("/metrics")
    text = await metrics.text()
    health = await admin.get("/healthz")
    ready = await admin.get("/readyz")

    assert metrics.headers["Content-Type"].startswith("text/plain; version=")
    compiled = "true" if BUILD_UNDER_TEST == "compiled" else "false"
    assert f'sidecar_build_info{{compiled="{compiled}",version="{__version__}"}} 1.0' in text
    assert 'sidecar_requests_total{method="GET",outcome="ok",route="default"} 1.0' in text
    assert 'sidecar_upstream_attempts_total{route="default",status="200"} 1.0' in text
    assert 'sidecar_in_flight_requests{route="default"} 0.0' in text
    assert "sidecar_request_duration_seconds_bucket" in text
    assert "sidecar_upstream_duration_seconds_bucket" in text
    assert "_created" not in text
    assert health.status == 200
    assert ready.status == 503, "not ready until the server has bound its port"
    assert all("Server" not in answer.headers for answer in (metrics, health, ready))


async def test_malformed_request_line_gets_400(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(sidecar.client.port, b"GARBAGE\x00 / HTTP/9\r\n\r\n")

    assert answer.split(b" ", 2)[1] == b"400"
    assert tool.seen == []


async def test_absolute_form_target_cannot_choose_the_upstream(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(
        sidecar.client.port,
        b"GET http://169.254.169.254/latest HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
    )

    assert answer.startswith(b"HTTP/1.1 404")
    assert b"NO_ROUTE" in answer
    assert tool.seen == []


async def test_non_utf8_header_values_are_refused_rather_than_silently_changed(
    make_tool, make_sidecar
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(
        sidecar.client.port,
        b"GET /x HTTP/1.1\r\nHost: a\r\nX-Latin: caf\xe9\r\nConnection: close\r\n\r\n",
    )

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request")
    assert b"\r\nX-Sidecar-Outcome: not-retryable\r\n" in head
    error = json.loads(body)["error"]
    assert (error["code"], error["message"]) == ("BAD_REQUEST", "header X-Latin is not valid UTF-8")
    assert tool.seen == []


async def test_utf8_header_values_pass_through(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    await raw_exchange(
        sidecar.client.port,
        "GET /x HTTP/1.1\r\nHost: a\r\nX-City: Zürich\r\nConnection: close\r\n\r\n".encode(),
    )

    assert tool.seen[0].headers["X-City"] == "Zürich"


async def test_a_garbled_chunked_body_gets_400_and_no_error_log(
    make_tool, make_sidecar, caplog: pytest.LogCaptureFixture
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    with caplog.at_level(logging.WARNING):
        for body in (b"ZZ\r\nabc\r\n0\r\n\r\n", b"5\r\nabcde\r\n" * 3000 + b"ZZ\r\n"):
            answer = await raw_exchange(
                sidecar.client.port,
                b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body,
                until_closed=True,
            )
            assert answer.split(b" ", 2)[1] == b"400"

    assert tool.seen == []
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_process_metrics_are_exported(make_tool, make_sidecar, aiohttp_client):
    sidecar = await make_sidecar(await make_tool(ok))
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    text = await (await admin.get("/metrics")).text()

    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"):
        assert f"\n{name} " in text
    assert "python_info{" in text


@pytest.mark.parametrize(
    ("head", "method", "message"),
    [
        (b"CONNECT tool.example:443 HTTP/1.1\r\nHost: tool.example:443", "CONNECT", "CONNECT"),
        (b"OPTIONS * HTTP/1.1\r\nHost: a", "OPTIONS", "no route matches this path"),
    ],
)
async def test_requests_without_a_path_get_no_route_and_are_counted(
    make_tool, make_sidecar, head, method, message
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(sidecar.client.port, head + b"\r\nConnection: close\r\n\r\n")

    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 404 Not Found"
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "NO_ROUTE"
    assert message in error["message"]
    assert tool.seen == []
    counted = {"route": "(none)", "method": method, "outcome": "not-retryable"}
    assert sidecar.metric("sidecar_requests_total", **counted) == 1


async def test_an_unknown_method_is_one_malformed_request_line(
    make_tool, make_sidecar, caplog: pytest.LogCaptureFixture
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    with caplog.at_level(logging.INFO):
        answer = await raw_exchange(
            sidecar.client.port, b"FOO / HTTP/1.1\r\nHost: a\r\n\r\n", until_closed=True
        )

    assert answer.startswith(b"HTTP/1.0 400")
    [record] = [record for record in caplog.records if record.msg == "malformed_request"]

    assert record.levelno == logging.INFO
    assert record.reason == "Invalid method encountered"
    assert tool.seen == []
