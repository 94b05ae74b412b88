"""OpenTelemetry spans for each request: the agent's call, each attempt, each repair, the LLM.

A SERVER span per request continues the agent's ``traceparent``; each attempt is a CLIENT
span under it whose context goes upstream in ``traceparent``, so the tool's own spans hang
under the attempt that reached it. Waits and the repair feedback are events. Attributes
hold names, numbers and the sidecar's own words only: never a payload value, a header or
a URL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar import __version__
from sidecar.telemetry.contract import Sink
from sidecar.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BudgetExhausted,
    CircuitRefused,
    LlmRequest,
    PayloadRepaired,
    RepairedRetry,
    RepairFinished,
    RepairRefused,
    RepairResult,
    RepairStarted,
    Request,
    RequestFinished,
    RequestReceived,
    RetryScheduled,
    SidecarOverloaded,
)
from sidecar.telemetry.metric_definitions import KNOWN_METHODS


@dataclass(slots=True, eq=False)
class _Spans:
    """A request's open spans, kept on its ``Request`` from its first event to its last."""

    server: Span
    # The last attempt's span and when it ended, until what followed it is known.
    attempt: tuple[Span, int | None] | None = None
    repair: Span | None = None
    # A repair after a failed attempt awaits its payload's answer.
    feedback: bool = False


class TraceSink(Sink):
    """Spans and span events for every event of a request."""

    def __init__(self, provider: TracerProvider, llm_model: str) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("sidecar", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._llm_model = llm_model

    def flush(self) -> None:
        self._provider.force_flush()

    def close(self) -> None:
        self._provider.shutdown()

    def request_received(self, event: RequestReceived) -> None:
        parent = self._propagator.extract(event.headers) if event.headers is not None else None
        method = _method(event.method)
        server = self._tracer.start_span(
            f"{method} {event.route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": event.route,
                "sidecar.route": event.route,
            },
        )
        event.request.spans = _Spans(server)

    def attempt_started(self, event: AttemptStarted) -> None:
        request = event.request
        spans = _spans(request)
        if request is None or spans is None:
            return
        _end_attempt(spans)
        attributes: dict[str, Any] = {
            "http.request.method": _method(request.method),
            "sidecar.attempt": event.attempt,
        }
        if event.attempt > 1:
            attributes["http.request.resend_count"] = event.attempt - 1
        span = self._tracer.start_span(
            _method(request.method),
            context=trace.set_span_in_context(spans.server),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        spans.attempt = (span, None)
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(span))
        request.upstream_headers = carrier

    def attempt_finished(self, event: AttemptFinished) -> None:
        request = event.request
        spans = _spans(request)
        if request is None or spans is None or spans.attempt is None:
            return
        span = spans.attempt[0]
        label = event.label
        if label.isdigit():
            span.set_attribute("http.response.status_code", int(label))
            if int(label) >= 400:
                span.set_attribute("error.type", label)
                span.set_status(Status(StatusCode.ERROR))
        else:
            span.set_attribute("error.type", label)
            span.set_status(Status(StatusCode.ERROR))
        if event.failure is not None:
            for name, value in (
                ("sidecar.error_code", event.failure.code),
                ("sidecar.error_category", event.failure.category),
            ):
                if value:
                    span.set_attribute(name, value)
        spans.attempt = (span, time.time_ns())
        request.exemplar = _exemplar(span)

    def retry_scheduled(self, event: RetryScheduled) -> None:
        spans = _spans(event.request)
        if spans is None:
            return
        _end_attempt(spans, event.reason)
        spans.server.add_event(
            "retry.wait",
            {
                "sidecar.attempt": event.attempt,
                "sidecar.wait.source": event.wait.source,
                "sidecar.wait.seconds": event.wait.seconds,
            },
        )

    def repaired_retry(self, event: RepairedRetry) -> None:
        spans = _spans(event.request)
        if spans is not None:
            _end_attempt(spans, "repaired", event.layer)

    def repair_started(self, event: RepairStarted) -> None:
        spans = _spans(event.request)
        if spans is None:
            return
        span = self._tracer.start_span("repair", context=trace.set_span_in_context(spans.server))
        span.add_event("validation_feedback.started", {"sidecar.attempt": event.attempt})
        spans.repair = span
        spans.feedback = True

    def payload_repaired(self, event: PayloadRepaired) -> None:
        spans = _spans(event.request)
        if spans is None:
            return
        attributes = {
            "sidecar.repair.layer": event.layer,
            "sidecar.repair.fields": list(event.fields),
        }
        span = spans.repair
        if span is None:
            # Coercion before the first attempt: its own short span under the request.
            span = self._tracer.start_span(
                f"repair {event.layer}", context=trace.set_span_in_context(spans.server)
            )
            span.set_attributes(attributes)
            _coercion_event(span, event)
            span.end()
            return
        span.update_name(f"repair {event.layer}")
        span.set_attributes(attributes)
        _coercion_event(span, event)

    def repair_result(self, event: RepairResult) -> None:
        spans = _spans(event.request)
        if spans is None:
            return
        if spans.repair is not None:
            spans.repair.set_attribute("sidecar.repair.result", event.result)
        if event.result in ("succeeded", "failed") and spans.feedback:
            spans.feedback = False
            spans.server.add_event(
                f"validation_feedback.{event.result}", {"sidecar.repair.layer": event.layer}
            )

    def repair_refused(self, event: RepairRefused) -> None:
        spans = _spans(event.request)
        if spans is not None and spans.repair is not None:
            spans.repair.set_attributes(
                {"sidecar.repair.result": "refused", "sidecar.repair.refusal": event.reason}
            )

    def repair_finished(self, event: RepairFinished) -> None:
        spans = _spans(event.request)
        if spans is None or spans.repair is None:
            return
        span, spans.repair = spans.repair, None
        if not event.layer:
            span.set_attribute("sidecar.repair.layer", "none")
            if spans.feedback:
                spans.feedback = False
                spans.server.add_event(
                    "validation_feedback.failed", {"sidecar.repair.layer": "none"}
                )
        span.end()

    def llm_request(self, event: LlmRequest) -> None:
        spans = _spans(event.request)
        parent = (spans.repair or spans.server) if spans is not None else None
        ended = time.time_ns()
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": self._llm_model,
            "sidecar.llm.result": event.result,
            "sidecar.llm.response_format": event.response_format,
        }
        if event.input_tokens:
            attributes["gen_ai.usage.input_tokens"] = event.input_tokens
        if event.output_tokens:
            attributes["gen_ai.usage.output_tokens"] = event.output_tokens
        span = self._tracer.start_span(
            f"chat {self._llm_model}",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=ended - int(event.duration_s * 1e9),
        )
        if event.result != "ok":
            span.set_attribute(
                "error.type", type(event.failure).__name__ if event.failure else event.result
            )
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=ended)

    def budget_exhausted(self, event: BudgetExhausted) -> None:
        _server_event(event.request, "retry_budget.exhausted", {})

    def circuit_refused(self, event: CircuitRefused) -> None:
        _server_event(event.request, "circuit.refused", {})

    def sidecar_overloaded(self, event: SidecarOverloaded) -> None:
        _server_event(
            event.request, "sidecar.overloaded", {"sidecar.overload.reason": event.reason}
        )

    def request_finished(self, event: RequestFinished) -> None:
        request = event.request
        spans = _spans(request)
        if request is None or spans is None:
            return
        request.spans = None
        _end_attempt(spans)
        if spans.repair is not None:
            spans.repair.end()
        server = spans.server
        server.set_attributes(
            {
                "sidecar.outcome": event.outcome,
                "sidecar.attempts": event.attempts,
                "sidecar.trail": event.trail,
            }
        )
        if event.status:
            server.set_attribute("http.response.status_code", event.status)
        if event.status >= 500:
            server.set_attribute("error.type", str(event.status))
            server.set_status(Status(StatusCode.ERROR))
        request.exemplar = _exemplar(server)
        server.end()


def _end_attempt(spans: _Spans, reason: str = "", layer: str = "") -> None:
    """The last attempt's span, ended when its answer was, with what followed it."""
    pending, spans.attempt = spans.attempt, None
    if pending is None:
        return
    span, ended = pending
    if reason:
        span.set_attribute("sidecar.retry.reason", reason)
    if layer:
        span.set_attribute("sidecar.repair.layer", layer)
    span.end(end_time=ended)


def _server_event(request: Request | None, name: str, attributes: dict[str, Any]) -> None:
    spans = _spans(request)
    if spans is not None:
        spans.server.add_event(name, attributes)


def _spans(request: Request | None) -> _Spans | None:
    """The request's open spans; none for an event outside a request traced here."""
    return request.spans if request is not None else None


def _coercion_event(span: Span, event: PayloadRepaired) -> None:
    if event.layer == "coercion":
        span.add_event("coercion.applied", {"sidecar.repair.fields": list(event.fields)})


def _method(method: str) -> str:
    return method if method in KNOWN_METHODS else "_OTHER"


def _exemplar(span: Span) -> dict[str, str] | None:
    """The span's ids as exemplar labels, when the span is sampled."""
    context = span.get_span_context()
    if not context.trace_flags.sampled:
        return None
    return {
        "trace_id": trace.format_trace_id(context.trace_id),
        "span_id": trace.format_span_id(context.span_id),
    }
