"""Spans kept as plain records while a request runs, and handed on as records.

The SDK's own spans cost 25 µs each to start and end (attribute validation under a lock,
a context object per parent, the batch processor's lock and wake-up); a request makes at
least two. Here a span is a slotted record that the trace sink fills in. The sampler, the
id generator and the resource are still the SDK's, from the ``TracerProvider`` the
``OTEL_*`` variables configured. An ended, sampled span goes to the OTLP batcher as it is
(``otlp.py``), and to an SDK span processor (the console exporter's) as the SDK's
``ReadableSpan``.

A span under another follows its request's sampling decision, as the SDK's default
``parentbased_*`` samplers would decide it (``always_*`` and ``traceidratio`` decide the
same for every span of a trace).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from sidecar import __version__

if TYPE_CHECKING:
    from sidecar.telemetry.otlp import SpanBatcher

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_ERROR = Status(StatusCode.ERROR)
_UNSET = Status(StatusCode.UNSET)


class SpanRecord:
    """One span while it is open: ids, times, attributes and events as plain values."""

    __slots__ = (
        "attributes",
        "end_ns",
        "error",
        "events",
        "kind",
        "name",
        "parent_id",
        "parent_remote",
        "sampled",
        "span_id",
        "start_ns",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        kind: SpanKind,
        trace_id: int,
        parent_id: int | None,
        *,
        parent_remote: bool = False,
        sampled: bool,
        trace_state: TraceState | None,
        span_id: int,
        attributes: dict[str, Any],
        start_ns: int | None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        # The parent's span id, and whether it came from the agent: plain values, where a
        # SpanContext would be validated and built for every span.
        self.parent_id = parent_id
        self.parent_remote = parent_remote
        self.sampled = sampled
        self.trace_state = trace_state
        self.attributes = attributes
        self.events: list[tuple[str, Mapping[str, Any], int]] = []
        self.error = False
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self.end_ns: int | None = None

    def add_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        if self.sampled:
            self.events.append((name, attributes, time.time_ns()))

    def context(self) -> SpanContext:
        flags = _SAMPLED if self.sampled else _NOT_SAMPLED
        return SpanContext(self.trace_id, self.span_id, False, flags, self.trace_state)

    def traceparent(self) -> dict[str, str]:
        """The W3C headers that carry this span's context to the next hop."""
        carrier = {
            "traceparent": f"00-{self.trace_id:032x}-{self.span_id:016x}-"
            f"{'01' if self.sampled else '00'}"
        }
        if self.trace_state:
            carrier["tracestate"] = self.trace_state.to_header()
        return carrier

    def exemplar(self) -> dict[str, str] | None:
        """The span's ids as exemplar labels, when the span is sampled."""
        if not self.sampled:
            return None
        return {"trace_id": f"{self.trace_id:032x}", "span_id": f"{self.span_id:016x}"}


class SpanRecorder:
    """Starts span records as the provider's sampler and id generator say, and hands each
    ended, sampled one on: to the OTLP batcher as the record it is, and to any SDK span
    processor (the console exporter's) as the SDK's ``ReadableSpan``."""

    def __init__(
        self,
        provider: TracerProvider,
        processors: Iterable[SpanProcessor],
        batcher: SpanBatcher | None = None,
    ) -> None:
        self._sampler = provider.sampler
        # The SDK's default sampler (parentbased_always_on) and always_on decide a span
        # without a parent before looking at it: sampled, its attributes as given. Asked
        # anyway, they cost a request 20,000 instructions.
        self._samples_every_root = any(
            provider.sampler is sampler for sampler in (sampling.DEFAULT_ON, sampling.ALWAYS_ON)
        )
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._processors = tuple(processors)
        self._batcher = batcher
        self._scope = InstrumentationScope("sidecar", __version__)

    def start_root(
        self, name: str, kind: SpanKind, parent: Context | None, attributes: dict[str, Any]
    ) -> SpanRecord:
        """A span that continues ``parent`` (an extracted remote context) or starts a trace;
        the sampler decides here for all the spans under it."""
        remote = trace.get_current_span(parent).get_span_context() if parent else None
        if remote is not None and remote.is_valid:
            trace_id = remote.trace_id
        else:
            remote, trace_id = None, self._ids.generate_trace_id()
        sampled, trace_state = True, None
        if remote is not None or not self._samples_every_root:
            result = self._sampler.should_sample(parent, trace_id, name, kind, attributes)
            sampled = result.decision is Decision.RECORD_AND_SAMPLE
            trace_state = result.trace_state
            attributes = dict(result.attributes) if result.attributes else attributes
        return SpanRecord(
            name,
            kind,
            trace_id,
            remote.span_id if remote is not None else None,
            parent_remote=remote is not None,
            sampled=sampled,
            trace_state=trace_state,
            span_id=self._ids.generate_span_id(),
            attributes=attributes,
            start_ns=None,
        )

    def start_child(
        self,
        name: str,
        parent: SpanRecord,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
        start_ns: int | None = None,
    ) -> SpanRecord:
        return SpanRecord(
            name,
            kind,
            parent.trace_id,
            parent.span_id,
            sampled=parent.sampled,
            trace_state=parent.trace_state,
            span_id=self._ids.generate_span_id(),
            attributes=attributes if attributes is not None else {},
            start_ns=start_ns,
        )

    def end(self, span: SpanRecord, end_ns: int | None = None) -> None:
        """End ``span`` (once); a sampled one goes to the batcher and the processors."""
        if span.end_ns is not None:
            return
        span.end_ns = time.time_ns() if end_ns is None else end_ns
        if not span.sampled:
            return
        if self._batcher is not None:
            self._batcher.add(span)
        if self._processors:
            self._to_processors(span)

    def _to_processors(self, span: SpanRecord) -> None:
        readable = ReadableSpan(
            span.name,
            context=span.context(),
            parent=_parent_context(span),
            resource=self._resource,
            attributes=span.attributes,
            events=[Event(name, attributes, at) for name, attributes, at in span.events],
            kind=span.kind,
            status=_ERROR if span.error else _UNSET,
            start_time=span.start_ns,
            end_time=span.end_ns,
            instrumentation_scope=self._scope,
        )
        for processor in self._processors:
            processor.on_end(readable)


def _parent_context(span: SpanRecord) -> SpanContext | None:
    if span.parent_id is None:
        return None
    flags = _SAMPLED if span.sampled else _NOT_SAMPLED
    return SpanContext(span.trace_id, span.parent_id, span.parent_remote, flags, span.trace_state)
