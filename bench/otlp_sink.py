"""An OTLP/HTTP trace collector for the benchmark: decodes each export, counts its spans.

python bench/otlp_sink.py PORT      (GET /count answers how many spans arrived)
"""

from __future__ import annotations

import argparse

import uvloop
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ACCEPTED = ExportTraceServiceResponse().SerializeToString()


def make_app() -> web.Application:
    spans = 0

    async def traces(request: web.Request) -> web.Response:
        nonlocal spans
        export = ExportTraceServiceRequest.FromString(await request.read())
        spans += sum(
            len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans
        )
        return web.Response(body=_ACCEPTED, content_type="application/x-protobuf")

    async def count(_: web.Request) -> web.Response:
        return web.Response(text=str(spans))

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/count", count)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    uvloop.install()
    web.run_app(make_app(), host="127.0.0.1", port=args.port, access_log=None, print=None)
