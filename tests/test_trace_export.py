"""The OTLP/HTTP export as the OTEL_* variables describe it: endpoint, headers,
compression, batches, and a collector that is briefly unavailable."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from sidecar.serve.app import HOOKS
from tests.otlp import ReceivedSpan, decode


class Collector:
    """A collector on loopback: each export's headers and decoded spans, and a script of
    statuses to answer with (200 once the script runs out)."""

    def __init__(self, statuses: tuple[int, ...] = ()) -> None:
        self.statuses = list(statuses)
        self.headers: list[dict[str, str]] = []
        self.exports: list[list[ReceivedSpan]] = []

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.headers.append({name.lower(): value for name, value in request.headers.items()})
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.exports.append(decode(body))  # aiohttp has undone any Content-Encoding
        return web.Response(status=status)


async def start_collector(aiohttp_server, collector: Collector, path: str = "/v1/traces") -> str:
    app = web.Application()
    app.router.add_post(path, collector.traces)
    server = await aiohttp_server(app)
    return str(server.make_url(path))


async def ok(_: web.Request) -> web.Response:
    return web.json_response({"success": True})


async def exported(sidecar) -> None:
    await asyncio.to_thread(sidecar.app[HOOKS].flush)


async def test_headers_and_gzip_come_from_the_standard_variables(
    aiohttp_server, make_tool, make_sidecar, monkeypatch: pytest.MonkeyPatch
):
    collector = Collector()
    endpoint = await start_collector(aiohttp_server, collector)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=general,x-tenant=a%20b")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    sidecar = await make_sidecar(await make_tool(ok))

    await sidecar.client.get("/items")
    await exported(sidecar)

    [headers] = collector.headers
    # The traces variable wins over the general one, as in the SDK; it is not merged.
    assert headers["x-api-key"] == "traces"
    assert "x-tenant" not in headers
    assert headers["content-encoding"] == "gzip"
    assert headers["content-type"] == "application/x-protobuf"
    assert sorted(span.name for span in collector.exports[0]) == ["GET", "GET default"]


async def test_the_general_endpoint_gets_the_traces_path(
    aiohttp_server, make_tool, make_sidecar, monkeypatch: pytest.MonkeyPatch
):
    collector = Collector()
    endpoint = await start_collector(aiohttp_server, collector, "/otlp/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.removesuffix("/v1/traces") + "/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=a%20b")
    sidecar = await make_sidecar(await make_tool(ok))

    await sidecar.client.get("/items")
    await exported(sidecar)

    assert len(collector.exports) == 1
    assert collector.headers[0]["x-tenant"] == "a b"


async def test_batches_are_as_large_as_the_batch_size_allows(
    aiohttp_server, make_tool, make_sidecar, monkeypatch: pytest.MonkeyPatch
):
    collector = Collector()
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", await start_collector(aiohttp_server, collector)
    )
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "3")
    sidecar = await make_sidecar(await make_tool(ok))

    for _ in range(4):
        await sidecar.client.get("/items")
    await exported(sidecar)

    # Each request's two spans; how they fall into batches depends on when the worker wakes.
    assert sum(len(spans) for spans in collector.exports) == 8
    assert max(len(spans) for spans in collector.exports) == 3


async def test_a_collector_briefly_unavailable_gets_the_batch_again(
    aiohttp_server, make_tool, make_sidecar, monkeypatch: pytest.MonkeyPatch
):
    collector = Collector(statuses=(503,))
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", await start_collector(aiohttp_server, collector)
    )
    sidecar = await make_sidecar(await make_tool(ok))

    await sidecar.client.get("/items")
    await exported(sidecar)

    assert len(collector.headers) == 2  # the 503, then the export that arrived
    assert sorted(span.name for span in collector.exports[0]) == ["GET", "GET default"]
