"""What the sidecar refuses, where it never sends traffic, and what it never reveals."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from sidecar.config import TUNING_FIELDS, ConfigError, Settings, load_settings
from sidecar.serve.app import create_admin_app
from tests.conftest import completion
from tests.rawhttp import raw_exchange

pytestmark = pytest.mark.security


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"success": True})


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize(
    "target",
    [
        "/weather/../admin",
        "/weather/./current",
        "/weather/%2e%2e/admin",
        "/weather/%2E%2e%2fadmin",
        "/weather/..%2Fadmin",
        "/..",
    ],
)
async def test_dot_segments_are_refused_before_any_route_is_chosen(make_tool, make_sidecar, target):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url + "api/"}]
    )

    answer = await raw_exchange(
        sidecar.client.port,
        f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
    )

    assert status_of(answer) == 400
    assert tool.seen == []


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /weather/..#x HTTP/1.1\r\nHost: x\r\n",
        b"GET /weather/%2e%2e# HTTP/1.1\r\nHost: x\r\n",
        b"GET /weather/.%2E#frag HTTP/1.1\r\nHost: x\r\n",
        b"GET /weather/now HTTP/1.1\r\n",  # HTTP/1.1 requires Host (RFC 9112 §3.2)
    ],
)
async def test_a_fragment_or_a_missing_host_is_refused_and_reaches_no_tool(
    make_tool, make_sidecar, request_head
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url + "v2/weather"}]
    )

    answer = await raw_exchange(
        sidecar.client.port, request_head + b"Connection: close\r\n\r\n", until_closed=True
    )

    assert status_of(answer) == 400
    assert b'"BAD_REQUEST"' in answer
    assert tool.seen == []
    # The same connection's next request is not read: a well-formed one still works.
    healthy = await raw_exchange(
        sidecar.client.port, b"GET /weather/now HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status_of(healthy) == 200
    assert len(tool.seen) == 1


async def test_backslashes_escapes_and_path_parameters_reach_the_tool_as_sent(
    make_tool, make_sidecar
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url + "v2/weather"}]
    )
    target = "/weather/a\\b%5cc;v=1/%2F%41?q=%5c"

    answer = await raw_exchange(
        sidecar.client.port,
        f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
        until_closed=True,
    )

    assert status_of(answer) == 200
    assert [seen.raw_path for seen in tool.seen] == ["/v2/weather" + target]


async def test_an_http10_request_needs_no_host(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(sidecar.client.port, b"GET /x HTTP/1.0\r\n\r\n", until_closed=True)

    assert status_of(answer) == 200


async def test_names_with_dots_are_not_dot_segments(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    for path in ("/.well-known/openid", "/v1.2/items", "/a/b..c", "/..."):
        assert (await sidecar.client.get(path)).status == 200
    assert [seen.raw_path for seen in tool.seen] == [
        "/.well-known/openid",
        "/v1.2/items",
        "/a/b..c",
        "/...",
    ]


@pytest.mark.parametrize(
    "target", ["http://169.254.169.254/latest/meta-data", "//evil.example/x", "evil.example:80"]
)
async def test_a_request_cannot_choose_its_upstream(make_tool, make_sidecar, target):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url}]
    )

    answer = await raw_exchange(
        sidecar.client.port,
        f"GET {target} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n".encode(),
    )

    assert status_of(answer) in (400, 404)
    assert tool.seen == []


async def test_host_and_control_headers_cannot_redirect_a_call(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get(
        "/x",
        headers={
            "Host": "evil.example",
            "X-Sidecar-Upstream": "http://evil.example",
            "X-Sidecar-Route": "admin",
            "X-Forwarded-Host": "evil.example",
        },
    )

    assert response.status == 200
    [seen] = tool.seen  # the configured tool, whatever the headers said
    assert seen.headers["Host"] == "evil.example"  # the agent's, for the tool to judge
    assert seen.headers["X-Forwarded-Host"] == "evil.example"  # reported, never followed
    assert not [name for name in seen.headers if name.lower().startswith("x-sidecar-")]


@pytest.mark.parametrize(
    ("host_rewrite", "host_seen"), [(False, "agent.local:8090"), (True, "the tool's own")]
)
async def test_the_tool_gets_the_agents_host_unless_the_route_rewrites_it(
    make_tool, make_sidecar, host_rewrite, host_seen
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool, host_rewrite=host_rewrite)

    await sidecar.client.get("/x", headers={"Host": "agent.local:8090"})

    [seen] = tool.seen
    expected = f"127.0.0.1:{tool.server.port}" if host_rewrite else host_seen
    assert seen.headers.getall("Host") == [expected]
    assert seen.headers["X-Forwarded-Host"] == "agent.local:8090"


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        b"Content-Length: 4\r\nContent-Length: 5\r\n",
        b"Transfer-Encoding: chunked, identity\r\n",
        b"Transfer-Encoding: xchunked\r\n",
        b"Content-Length: -4\r\n",
        b"Content-Length: 0x4\r\n",
    ],
    ids=["cl-and-te", "two-lengths", "te-list", "te-unknown", "negative-cl", "hex-cl"],
)
async def test_smuggling_shaped_requests_are_refused(make_tool, make_sidecar, head):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    answer = await raw_exchange(
        sidecar.client.port,
        b"POST /x HTTP/1.1\r\nHost: a\r\n" + head + b"\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
    )

    assert status_of(answer) in (400, 501)
    assert [seen.raw_path for seen in tool.seen] == []


SECRETS = (
    "sk-live-SECRET-1",
    "Bearer-token-SECRET-2",
    "cookie-SECRET-3",
    "pw-SECRET-4",
    "query-SECRET-5",
    "header-key-SECRET-6",
)


async def test_secrets_never_reach_logs_metrics_or_prompts(make_tool, make_sidecar, make_llm):
    calls = 0

    async def busy_then_picky(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return web.json_response({}, status=503)
        payload = await request.json()
        if payload.get("city") == "Tokyo, Japan":
            return web.json_response({"success": True})
        return web.json_response(
            {
                "success": False,
                "error": {
                    "code": "CITY_NOT_FOUND",
                    "category": "NOT_FOUND",
                    "retryable": True,
                    "message": f"no city {payload.get('city')} (key {payload.get('api_key')})",
                },
            },
            status=404,
        )

    async def keeps_the_placeholders() -> web.Response:
        shown = llm.prompt()["failed_payload"]
        answer = {
            "can_fix": True,
            "analysis": "x",
            "corrected_payload": {**shown, "city": "Tokyo, Japan"},
            "is_transient": False,
        }
        return completion(json.dumps(answer))

    tool = await make_tool(busy_then_picky)
    llm = await make_llm(keeps_the_placeholders)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, log_level="debug")

    with capture_logs() as logs:
        response = await sidecar.client.post(
            "/weather?appid=query-SECRET-5",
            json={
                "city": "Tokio",
                "api_key": "sk-live-SECRET-1",
                "password": "pw-SECRET-4",
                "webhook": "https://hooks/x?token=Bearer-token-SECRET-2",
            },
            headers={
                "Authorization": "Bearer Bearer-token-SECRET-2",
                "Cookie": "session=cookie-SECRET-3",
                "X-Api-Key": "header-key-SECRET-6",
            },
        )

    assert response.status == 200
    exposed = json.dumps(logs, default=str) + generate_latest(sidecar.registry).decode()
    exposed += json.dumps(llm.requests)
    for secret in SECRETS:
        assert secret not in exposed, secret
    assert json.loads(tool.seen[-1].body)["api_key"] == "sk-live-SECRET-1"


# Credentials an agent may put in a path: each form, with its own marker.
PATH_CREDENTIALS = {
    "PATHSECRET-1": "/weather/x;access_token=PATHSECRET-1",
    "PATHSECRET-2": "/weather/x%3Ftoken%3DPATHSECRET-2",
    "PATHSECRET-3": "/weather/key=PATHSECRET-3",
    "PATHSECRET-4": "/weather/https%3A%2F%2Fuser:PATHSECRET-4@host/x",
    "PATHSECRET-5": "/weather/a%3Bsessionid%3DPATHSECRET-5",
}


async def test_credentials_in_a_path_reach_no_label_log_or_page(
    make_tool, make_sidecar, aiohttp_client
):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url}],
        access_log=True,
    )
    admin = await aiohttp_client(create_admin_app(sidecar.app))

    with capture_logs() as logs:
        for target in PATH_CREDENTIALS.values():
            answer = await raw_exchange(
                sidecar.client.port,
                f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
            )
            assert status_of(answer) == 200
    metrics = await (await admin.get("/metrics")).text()
    page = await (await admin.get("/ui/state.json")).text()

    assert len(tool.seen) == len(PATH_CREDENTIALS)  # the tool still got each as sent
    assert 'sidecar_circuit_state{route="weather",tool="/weather/x;access_token=***"}' in metrics
    exposed = {"metrics": metrics, "page": page, "logs": json.dumps(logs, default=str)}
    for secret in PATH_CREDENTIALS:
        for where, text in exposed.items():
            assert secret not in text, (secret, where)


async def test_metric_labels_stay_route_names_whatever_the_paths(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(
        routes=[{"name": "weather", "prefix": "/weather", "upstream": tool.url}]
    )
    rng = random.Random(7)

    for _ in range(200):
        noise = "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))
        prefix = rng.choice(["/weather/", "/other/", "/"])
        await (await sidecar.client.get(prefix + noise)).read()

    assert sidecar.label_values("route") == {"weather", "(none)"}


setting_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(
    max_examples=150,
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(
    st.dictionaries(
        st.sampled_from([*sorted(Settings.model_fields), "routes", "bogus"]), setting_values
    ),
    st.lists(
        st.dictionaries(
            st.sampled_from(
                ["name", "prefix", "upstream", "strip_prefix", "schema", *sorted(TUNING_FIELDS)]
            ),
            setting_values,
        ),
        max_size=2,
    ),
)
def test_any_config_file_loads_or_fails_with_one_clean_line(tmp_path: Path, document, routes):
    if routes:
        document = {**document, "routes": routes}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_settings(config_file=str(path))
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        assert message.startswith(("configuration error: ", "config_file: "))


async def test_unknown_methods_share_one_label(make_tool, make_sidecar):
    tool = await make_tool(ok)
    sidecar = await make_sidecar(tool)

    # The HTTP parser refuses tokens it does not know (FOO gets 400); these it knows.
    for method in ("PURGE", "PROPFIND", "MKCOL", "GET"):
        await (await sidecar.client.request(method, "/x")).read()

    assert sidecar.label_values("method") == {"OTHER", "GET"}
    assert [seen.method for seen in tool.seen] == ["PURGE", "PROPFIND", "MKCOL", "GET"]
