"""An OTLP/HTTP trace receiver on 127.0.0.1: what an OpenTelemetry collector would get."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class ReceivedSpan:
    """One exported span, decoded: ids as hex, attributes and events as plain values."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any]

    @property
    def is_server(self) -> bool:
        return self.kind == ProtoSpan.SPAN_KIND_SERVER

    @property
    def is_client(self) -> bool:
        return self.kind == ProtoSpan.SPAN_KIND_CLIENT


@dataclass
class Receiver:
    server: TestServer | None = None
    bodies: list[bytes] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    spans: list[ReceivedSpan] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("/v1/traces"))

    def children_of(self, span: ReceivedSpan) -> list[ReceivedSpan]:
        found = [child for child in self.spans if child.parent_id == span.span_id]
        return sorted(found, key=lambda child: child.start_ns)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one OTLP/HTTP protobuf export."""
    spans = []
    for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=span.kind,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        events=[
                            (event.name, event.time_unix_nano, _attributes(event.attributes))
                            for event in span.events
                        ],
                        resource=resource,
                    )
                )
    return spans


def receiver_app(receiver: Receiver) -> web.Application:
    """POST /v1/traces as a collector answers it, every export kept in ``receiver``."""

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        receiver.bodies.append(body)
        receiver.content_types.append(request.content_type)
        receiver.spans.extend(decode(body))
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    return app


async def start_receiver(aiohttp_server: Any) -> Receiver:
    receiver = Receiver()
    receiver.server = await aiohttp_server(receiver_app(receiver))
    return receiver
