"""Whether the standard ``OTEL_*`` variables turn tracing on, and the provider they describe.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``), or
when it is unset and ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is. ``OTEL_TRACES_EXPORTER=none`` or
``OTEL_SDK_DISABLED=true`` keeps it off whatever else is set. Every other setting (the
endpoint, its headers and timeout, the sampler, the service name, resource attributes, the
batch sizes) is read as the SDK reads it: the sampler and resource by the SDK itself, the
OTLP exporter's and batches' settings by ``otlp.py`` from the SDK's own variables.

The SDK is imported only when tracing is on: the sidecar that does not trace does not
carry it in memory. It comes with the ``otel`` extra; tracing asked for without it is a
configuration error, found at start-up and by ``check-config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar import __version__
from sidecar.config import ConfigError
from sidecar.config.extras import require_extra

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    from sidecar.telemetry.otlp import SpanBatcher

SERVICE_NAME = "tool-retry-sidecar"
_EXPORTERS = ("otlp", "console")
_PROTOCOL = "http/protobuf"


def tracing_exporters(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The exporters the environment asks for; empty when tracing is off.

    Raises ``ConfigError`` when they cannot be had: an exporter or protocol not shipped,
    or the ``otel`` extra not installed.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not named:
        turned_on_by = next(
            (
                name
                for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
                if environ.get(name)
            ),
            None,
        )
        if turned_on_by is None:
            return ()
        exporters: tuple[str, ...] = ("otlp",)
    else:
        turned_on_by = "OTEL_TRACES_EXPORTER"
        exporters = tuple(name.strip() for name in named.split(",") if name.strip())
        if "none" in exporters:
            return ()
    unknown = [name for name in exporters if name not in _EXPORTERS]
    if unknown:
        raise ConfigError(
            f"configuration error: OTEL_TRACES_EXPORTER: {', '.join(unknown)} is not one of "
            f"{', '.join(_EXPORTERS)}, none"
        )
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or _PROTOCOL
    ).strip()
    if "otlp" in exporters and protocol != _PROTOCOL:
        raise ConfigError(
            f"configuration error: OTEL_EXPORTER_OTLP_PROTOCOL: {protocol} is not supported, "
            f"only {_PROTOCOL}"
        )
    require_extra("otel", f"tracing ({turned_on_by})")
    return exporters


@dataclass(frozen=True)
class Tracing:
    """What traces need at run time: the provider (sampler, ids, resource), the SDK span
    processors (the console exporter's, or the SDK's OTLP exporter with a credential
    provider), and the sidecar's own OTLP batcher otherwise."""

    provider: TracerProvider
    processors: list[SpanProcessor]
    batcher: SpanBatcher | None


def tracer_provider(exporters: tuple[str, ...]) -> Tracing:
    """The provider and exporters ``exporters`` name, in batches, sampled as the
    environment says."""
    # ``tracing_exporters`` made sure the otel extra is installed.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    # The sampler is the SDK's reading of OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG.
    provider = TracerProvider(resource=resource)
    processors: list[SpanProcessor] = []
    batcher = None
    if "console" in exporters:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    if "otlp" in exporters and _credential_provider(os.environ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    elif "otlp" in exporters:
        from sidecar.telemetry.otlp import Encoder, Sender, SpanBatcher

        batcher = SpanBatcher(Encoder(resource, "sidecar", __version__), Sender())
    for processor in processors:
        provider.add_span_processor(processor)
    return Tracing(provider, processors, batcher)


def _credential_provider(environ: Mapping[str, str]) -> bool:
    """Whether the SDK's exporter is to get its HTTP session from a credential provider
    (an entry point only the SDK's exporter loads)."""
    return any(
        environ.get(name)
        for name in (
            "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
            "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
        )
    )
