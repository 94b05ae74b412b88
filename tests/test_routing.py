"""Routes: longest prefix on whole segments, strip_prefix, upstream path prefixes."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web

from sidecar.config import load_settings, resolve_routes
from sidecar.serve.routing import RouteTable, target_fault


def table(*routes: dict) -> RouteTable:
    return RouteTable(resolve_routes(load_settings(routes=list(routes))))


FRAGMENT = "the request-target holds a '#'"
DOT = "path has a '.' or '..' segment"


@pytest.mark.parametrize(
    ("target", "fault"),
    [
        # A fragment is not part of a request-target: URL libraries drop it, and what is
        # left may be a dot segment the check below never saw as one.
        ("/weather/..#x", FRAGMENT),
        ("/weather/%2e%2e#", FRAGMENT),
        ("/weather/.%2E#frag", FRAGMENT),
        ("/weather/now#", FRAGMENT),
        ("/weather/now?city=x#y", FRAGMENT),
        ("/weather/%23", None),  # an encoded '#' is a path byte, passed on as sent
        ("/weather/..", DOT),
        ("/weather/%2e%2E/x", DOT),
        ("/weather/.%2e%2fadmin", DOT),
        ("/weather/..?q=1", DOT),
        ("/weather/now?next=/../x", None),  # the query is the tool's to read
        # Delimited by what some servers read as a separator: still a dot segment.
        ("/weather/..%5cadmin", DOT),
        ("/weather/..\\admin", DOT),
        ("/weather/a\\..", DOT),
        ("/weather/..;/admin", DOT),
        ("/weather/%2e%2e;x=1/admin", DOT),
        # Elsewhere these bytes are the tool's to read: passed on as sent.
        ("/weather/a\\b%5cc", None),
        ("/weather/x;jsessionid=1", None),
        ("/weather/..a;b", None),
        ("/weather/v1.2/...", None),
        ("/weather/now;a=..", None),
    ],
)
def test_targets_that_could_leave_their_route_are_refused_as_received(target, fault):
    assert target_fault(target) == fault


def test_longest_prefix_wins_and_only_on_segment_boundaries():
    routes = table(
        {"name": "root", "prefix": "/", "upstream": "http://root:1"},
        {"name": "weather", "prefix": "/weather", "upstream": "http://weather:1"},
        {"name": "forecast", "prefix": "/weather/forecast/", "upstream": "http://forecast:1"},
    )

    def route_of(target: str) -> str | None:
        match = routes.match(target)
        return match.route.name if match else None

    assert route_of("/weather") == "weather"
    assert route_of("/weather/") == "weather"
    assert route_of("/weather/now?city=x") == "weather"
    assert route_of("/weather?city=x") == "weather"
    assert route_of("/weatherman") == "root"
    assert route_of("/weather/forecast") == "forecast"
    assert route_of("/weather/forecasting") == "weather"
    assert route_of("/") == "root"


def test_without_a_catch_all_unmatched_paths_and_non_origin_targets_match_nothing():
    routes = table({"name": "weather", "prefix": "/weather", "upstream": "http://weather:1"})

    assert routes.match("/weatherman") is None
    assert routes.match("/") is None
    assert routes.match("http://evil.example/weather") is None
    assert routes.match("*") is None


def test_upstream_urls_keep_strip_and_prefix_paths_byte_for_byte():
    routes = table(
        {"name": "kept", "prefix": "/kept", "upstream": "http://tool:8080"},
        {
            "name": "stripped",
            "prefix": "/weather",
            "upstream": "http://tool:8080/",
            "strip_prefix": True,
        },
        {
            "name": "based",
            "prefix": "/b",
            "upstream": "http://tool:8080/v2/api/",
            "strip_prefix": True,
        },
    )

    def url_of(target: str) -> str:
        match = routes.match(target)
        assert match is not None
        return str(match.url)

    assert url_of("/kept/a%2Fb?x=%7E") == "http://tool:8080/kept/a%2Fb?x=%7E"
    assert url_of("/weather/api/current?q=1") == "http://tool:8080/api/current?q=1"
    assert url_of("/weather") == "http://tool:8080/"
    assert url_of("/weather?q=1") == "http://tool:8080/?q=1"
    assert url_of("/b/items") == "http://tool:8080/v2/api/items"


async def test_requests_go_to_their_route_and_unknown_paths_get_no_route(make_tool, make_sidecar):
    async def named(name: str):
        async def answer(request: web.Request) -> web.Response:
            return web.json_response({"tool": name, "path": request.raw_path})

        return await make_tool(answer)

    weather, search = await named("weather"), await named("search")
    sidecar = await make_sidecar(
        routes=[
            {
                "name": "weather",
                "prefix": "/weather",
                "upstream": weather.url,
                "strip_prefix": True,
            },
            {"name": "search", "prefix": "/search", "upstream": search.url},
        ]
    )

    to_weather = await sidecar.client.get("/weather/api/current?city=Tokyo")
    to_search = await sidecar.client.get("/search/q")
    nowhere = await sidecar.client.get("/weatherman")

    assert await to_weather.json() == {"tool": "weather", "path": "/api/current?city=Tokyo"}
    assert await to_search.json() == {"tool": "search", "path": "/search/q"}
    assert nowhere.status == 404
    envelope = orjson.loads(await nowhere.read())
    assert envelope["success"] is False
    assert envelope["error"]["code"] == "NO_ROUTE"
    assert envelope["error"]["category"] == "NOT_FOUND"
    assert envelope["error"]["details"]["source"] == "sidecar"
    assert (
        sidecar.metric(
            "sidecar_requests_total", route="(none)", method="GET", outcome="not-retryable"
        )
        == 1
    )
