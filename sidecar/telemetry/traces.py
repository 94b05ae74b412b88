"""OpenTelemetry spans for each request: the agent's call, each attempt, each repair, the LLM.

A SERVER span per request continues the agent's ``traceparent``; each attempt is a CLIENT
span under it whose context goes upstream in ``traceparent``, so the tool's own spans hang
under the attempt that reached it. Waits and the repair feedback are events. Attributes
hold names, numbers and the sidecar's own words only: never a payload value, a header or
a URL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.outcomes import CANCELLED_ATTEMPT
from sidecar.telemetry.contract import Sink
from sidecar.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BudgetExhausted,
    CircuitRefused,
    HedgeFinished,
    LlmCallFinished,
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
from sidecar.telemetry.otel import Tracing
from sidecar.telemetry.spans import SpanRecord, SpanRecorder


@dataclass(slots=True, eq=False)
class _Spans:
    """A request's open spans, kept from its first event to its last."""

    server: SpanRecord
    # Each attempt's span and when it ended, by attempt number, until what followed it is
    # known: one at a time, two while a hedge races the attempt it copies.
    attempts: dict[int, tuple[SpanRecord, int | None]] = field(default_factory=dict)
    repair: SpanRecord | None = None
    # A repair after a failed attempt awaits its payload's answer.
    feedback: bool = False


class OpenSpans:
    """Each request's open spans, by its ``Request``: the trace sink keeps them, and the
    pipeline asks them (as its ``Tracer``) for an attempt's context and a span's ids."""

    def __init__(self) -> None:
        self.by_request: dict[Request, _Spans] = {}

    def of(self, request: Request | None) -> _Spans | None:
        """The request's open spans; none for an event outside a request traced here."""
        return self.by_request.get(request) if request is not None else None

    def trace_headers(self, request: Request, attempt: int) -> dict[str, str] | None:
        spans = self.by_request.get(request)
        if spans is None or attempt not in spans.attempts:
            return None
        return spans.attempts[attempt][0].traceparent()

    def exemplar(self, request: Request, attempt: int | None) -> dict[str, str] | None:
        spans = self.by_request.get(request)
        if spans is None:
            return None
        if attempt is None:
            return spans.server.exemplar()
        started = spans.attempts.get(attempt)
        return started[0].exemplar() if started is not None else None


class TraceSink(Sink):
    """Spans and span events for every event of a request."""

    def __init__(self, tracing: Tracing, *, llm_model: str, spans: OpenSpans) -> None:
        self._open = spans
        self._tracing = tracing
        self._spans = SpanRecorder(tracing.provider, tracing.processors, tracing.batcher)
        self._propagator = TraceContextTextMapPropagator()
        self._llm_model = llm_model

    def flush(self) -> None:
        self._tracing.provider.force_flush()
        if self._tracing.batcher is not None:
            self._tracing.batcher.flush()

    def close(self) -> None:
        self._tracing.provider.shutdown()
        if self._tracing.batcher is not None:
            self._tracing.batcher.close()

    def request_received(self, event: RequestReceived) -> None:
        headers = event.headers
        # Most requests carry no context: the propagator's parse is for those that do.
        parent = (
            self._propagator.extract(headers)
            if headers is not None and "traceparent" in headers
            else None
        )
        method = _method(event.method)
        server = self._spans.start_root(
            f"{method} {event.route}",
            SpanKind.SERVER,
            parent,
            {
                "http.request.method": method,
                "http.route": event.route,
                "sidecar.route": event.route,
            },
        )
        self._open.by_request[event.request] = _Spans(server)

    def attempt_started(self, event: AttemptStarted) -> None:
        request = event.request
        spans = self._open.of(request)
        if request is None or spans is None:
            return
        self._end_attempts(spans, racing=event.hedge)
        attributes: dict[str, Any] = {
            "http.request.method": _method(request.method),
            "sidecar.attempt": event.attempt,
        }
        if event.attempt > 1:
            attributes["http.request.resend_count"] = event.attempt - 1
        if event.hedge:
            attributes["sidecar.hedge"] = True
        span = self._spans.start_child(
            _method(request.method), spans.server, kind=SpanKind.CLIENT, attributes=attributes
        )
        spans.attempts[event.attempt] = (span, None)

    def attempt_finished(self, event: AttemptFinished) -> None:
        request = event.request
        spans = self._open.of(request)
        if request is None or spans is None or event.attempt not in spans.attempts:
            return
        span = spans.attempts[event.attempt][0]
        attributes = span.attributes
        label = event.label
        if label == CANCELLED_ATTEMPT:
            # The copy racing it answered first: nothing follows this one.
            attributes["sidecar.hedge.cancelled"] = True
            self._spans.end(span)
            del spans.attempts[event.attempt]
            return
        if label.isdigit():
            attributes["http.response.status_code"] = int(label)
            if int(label) >= 400:
                attributes["error.type"] = label
                span.error = True
        else:
            attributes["error.type"] = label
            span.error = True
        if event.failure is not None:
            if event.failure.code:
                attributes["sidecar.error_code"] = event.failure.code
            if event.failure.category:
                attributes["sidecar.error_category"] = event.failure.category
        spans.attempts[event.attempt] = (span, time.time_ns())

    def retry_scheduled(self, event: RetryScheduled) -> None:
        spans = self._open.of(event.request)
        if spans is None:
            return
        self._end_attempts(spans, event.reason)
        spans.server.add_event(
            "retry.wait",
            {
                "sidecar.attempt": event.attempt,
                "sidecar.wait.source": event.wait.source,
                "sidecar.wait.seconds": event.wait.seconds,
            },
        )

    def repaired_retry(self, event: RepairedRetry) -> None:
        spans = self._open.of(event.request)
        if spans is not None:
            self._end_attempts(spans, "repaired", event.layer)

    def repair_started(self, event: RepairStarted) -> None:
        spans = self._open.of(event.request)
        if spans is None:
            return
        span = self._spans.start_child("repair", spans.server)
        span.add_event("validation_feedback.started", {"sidecar.attempt": event.attempt})
        spans.repair = span
        spans.feedback = True

    def payload_repaired(self, event: PayloadRepaired) -> None:
        spans = self._open.of(event.request)
        if spans is None:
            return
        attributes = {
            "sidecar.repair.layer": event.layer,
            "sidecar.repair.fields": tuple(event.fields),
        }
        span = spans.repair
        if span is None:
            # Coercion before the first attempt: its own short span under the request.
            span = self._spans.start_child(f"repair {event.layer}", spans.server)
            span.attributes.update(attributes)
            _coercion_event(span, event)
            self._spans.end(span)
            return
        span.name = f"repair {event.layer}"
        span.attributes.update(attributes)
        _coercion_event(span, event)

    def repair_result(self, event: RepairResult) -> None:
        spans = self._open.of(event.request)
        if spans is None:
            return
        if spans.repair is not None:
            spans.repair.attributes["sidecar.repair.result"] = event.result
        if event.result in ("succeeded", "failed") and spans.feedback:
            spans.feedback = False
            spans.server.add_event(
                f"validation_feedback.{event.result}", {"sidecar.repair.layer": event.layer}
            )

    def repair_refused(self, event: RepairRefused) -> None:
        spans = self._open.of(event.request)
        if spans is not None and spans.repair is not None:
            spans.repair.attributes.update(
                {"sidecar.repair.result": "refused", "sidecar.repair.refusal": event.reason}
            )

    def repair_finished(self, event: RepairFinished) -> None:
        spans = self._open.of(event.request)
        if spans is None or spans.repair is None:
            return
        span, spans.repair = spans.repair, None
        if not event.layer:
            span.attributes["sidecar.repair.layer"] = "none"
            if spans.feedback:
                spans.feedback = False
                spans.server.add_event(
                    "validation_feedback.failed", {"sidecar.repair.layer": "none"}
                )
        self._spans.end(span)

    def llm_call_finished(self, event: LlmCallFinished) -> None:
        spans = self._open.of(event.request)
        if spans is None:
            return
        parent = spans.repair or spans.server
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
        span = self._spans.start_child(
            f"chat {self._llm_model}",
            parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_ns=ended - int(event.duration_s * 1e9),
        )
        if event.result != "ok":
            attributes["error.type"] = (
                type(event.failure).__name__ if event.failure else event.result
            )
            span.error = True
        self._spans.end(span, ended)

    def budget_exhausted(self, event: BudgetExhausted) -> None:
        self._server_event(event.request, "retry_budget.exhausted", {})

    def circuit_refused(self, event: CircuitRefused) -> None:
        self._server_event(event.request, "circuit.refused", {"sidecar.tool": event.tool})

    def hedge_finished(self, event: HedgeFinished) -> None:
        self._server_event(event.request, "hedge.finished", {"sidecar.hedge.result": event.result})

    def sidecar_overloaded(self, event: SidecarOverloaded) -> None:
        self._server_event(
            event.request, "sidecar.overloaded", {"sidecar.overload.reason": event.reason}
        )

    def request_finished(self, event: RequestFinished) -> None:
        request = event.request
        spans = self._open.of(request)
        if request is None or spans is None:
            return
        del self._open.by_request[request]
        self._end_attempts(spans)
        if spans.repair is not None:
            self._spans.end(spans.repair)
        server = spans.server
        attributes = server.attributes
        attributes["sidecar.outcome"] = event.outcome
        attributes["sidecar.attempts"] = event.attempts
        attributes["sidecar.trail"] = event.trail
        if event.status:
            attributes["http.response.status_code"] = event.status
        if event.status >= 500:
            attributes["error.type"] = str(event.status)
            server.error = True
        self._spans.end(server)

    def _server_event(self, request: Request | None, name: str, attributes: dict[str, Any]) -> None:
        spans = self._open.of(request)
        if spans is not None:
            spans.server.add_event(name, attributes)

    def _end_attempts(
        self, spans: _Spans, reason: str = "", layer: str = "", *, racing: bool = False
    ) -> None:
        """The attempts' spans, each ended when its answer was, with what followed them;
        ``racing`` keeps the one still waiting for its answer, which a hedge now races."""
        for number, (span, ended) in list(spans.attempts.items()):
            if racing and ended is None:
                continue
            del spans.attempts[number]
            if reason:
                span.attributes["sidecar.retry.reason"] = reason
            if layer:
                span.attributes["sidecar.repair.layer"] = layer
            self._spans.end(span, ended)


def _coercion_event(span: SpanRecord, event: PayloadRepaired) -> None:
    if event.layer == "coercion":
        span.add_event("coercion.applied", {"sidecar.repair.fields": tuple(event.fields)})


def _method(method: str) -> str:
    return method if method in KNOWN_METHODS else "_OTHER"
