"""OpenTelemetry spans for each request: the agent's call, each attempt, each repair, the LLM.

A SERVER span per request continues the agent's ``traceparent``; each attempt is a CLIENT
span under it whose context goes upstream in ``traceparent``, so the tool's own spans hang
under the attempt that reached it. Waits and the repair feedback are events. Attributes
hold names, numbers and the sidecar's own words only: never a payload value, a header or
a URL.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar import __version__
from sidecar.telemetry.contract import RequestState, Sink
from sidecar.telemetry.metric_definitions import KNOWN_METHODS

_SERVER = "trace.server"
_ATTEMPT = "trace.attempt"  # the last attempt's span and when it ended, until its reason is known
_REPAIR = "trace.repair"
_FEEDBACK = "trace.feedback"  # a repair after a failed attempt awaits its payload's answer


class TraceSink(Sink):
    """Spans and span events for every stage of a request."""

    def __init__(self, provider: TracerProvider, llm_model: str) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("sidecar", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._llm_model = llm_model

    def flush(self) -> None:
        self._provider.force_flush()

    def close(self) -> None:
        self._provider.shutdown()

    def request_received(self, state: RequestState) -> None:
        parent = self._propagator.extract(state.incoming) if state.incoming is not None else None
        method = _method(state.method)
        state.scratch[_SERVER] = self._tracer.start_span(
            f"{method} {state.route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": state.route,
                "sidecar.route": state.route,
            },
        )
        state.incoming = None

    def attempt_started(self, state: RequestState) -> None:
        server = state.scratch.get(_SERVER)
        if server is None:
            return
        self._end_attempt(state)
        attributes: dict[str, Any] = {
            "http.request.method": _method(state.method),
            "sidecar.attempt": state.attempt,
        }
        if state.attempt > 1:
            attributes["http.request.resend_count"] = state.attempt - 1
        span = self._tracer.start_span(
            _method(state.method),
            context=trace.set_span_in_context(server),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        state.scratch[_ATTEMPT] = (span, None)
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(span))
        state.scratch["upstream_headers"] = carrier

    def attempt_finished(self, state: RequestState) -> None:
        pending = state.scratch.get(_ATTEMPT)
        if pending is None:
            return
        span = pending[0]
        label = state.label
        if label.isdigit():
            span.set_attribute("http.response.status_code", int(label))
            if int(label) >= 400:
                span.set_attribute("error.type", label)
                span.set_status(Status(StatusCode.ERROR))
        else:
            span.set_attribute("error.type", label)
            span.set_status(Status(StatusCode.ERROR))
        if state.failure is not None:
            for name, value in (
                ("sidecar.error_code", state.failure.code),
                ("sidecar.error_category", state.failure.category),
            ):
                if value:
                    span.set_attribute(name, value)
        state.scratch[_ATTEMPT] = (span, time.time_ns())
        state.exemplar = _exemplar(span)

    def retry_scheduled(self, state: RequestState) -> None:
        assert state.wait is not None
        self._end_attempt(state, state.reason)
        self._event(
            state,
            "retry.wait",
            {
                "sidecar.attempt": state.attempt,
                "sidecar.wait.source": state.wait.source,
                "sidecar.wait.seconds": state.wait.seconds,
            },
        )

    def repaired_retry(self, state: RequestState) -> None:
        self._end_attempt(state, "repaired", state.layer)

    def repair_started(self, state: RequestState) -> None:
        server = state.scratch.get(_SERVER)
        if server is None:
            return
        span = self._tracer.start_span("repair", context=trace.set_span_in_context(server))
        span.add_event("validation_feedback.started", {"sidecar.attempt": state.attempt})
        state.scratch[_REPAIR] = span
        state.scratch[_FEEDBACK] = True

    def payload_repaired(self, state: RequestState) -> None:
        attributes = {
            "sidecar.repair.layer": state.layer,
            "sidecar.repair.fields": list(state.changed),
        }
        span = state.scratch.get(_REPAIR)
        if span is None:
            server = state.scratch.get(_SERVER)
            if server is None:
                return
            # Coercion before the first attempt: its own short span under the request.
            span = self._tracer.start_span(
                f"repair {state.layer}", context=trace.set_span_in_context(server)
            )
            span.set_attributes(attributes)
            _coercion_event(span, state)
            span.end()
            return
        span.update_name(f"repair {state.layer}")
        span.set_attributes(attributes)
        _coercion_event(span, state)

    def repair_result(self, state: RequestState) -> None:
        span = state.scratch.get(_REPAIR)
        if span is not None:
            span.set_attribute("sidecar.repair.result", state.result)
        if state.result in ("succeeded", "failed") and state.scratch.pop(_FEEDBACK, False):
            self._event(
                state,
                f"validation_feedback.{state.result}",
                {"sidecar.repair.layer": state.layer},
            )

    def repair_refused(self, state: RequestState) -> None:
        span = state.scratch.get(_REPAIR)
        if span is not None:
            span.set_attributes(
                {"sidecar.repair.result": "refused", "sidecar.repair.refusal": state.reason}
            )

    def repair_finished(self, state: RequestState) -> None:
        span = state.scratch.pop(_REPAIR, None)
        if span is None:
            return
        if not state.layer:
            span.set_attribute("sidecar.repair.layer", "none")
            if state.scratch.pop(_FEEDBACK, False):
                self._event(state, "validation_feedback.failed", {"sidecar.repair.layer": "none"})
        span.end()

    def llm_request(self, state: RequestState) -> None:
        call = state.llm
        assert call is not None
        parent = state.scratch.get(_REPAIR) or state.scratch.get(_SERVER)
        ended = time.time_ns()
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": self._llm_model,
            "sidecar.llm.result": call.result,
        }
        if call.input_tokens:
            attributes["gen_ai.usage.input_tokens"] = call.input_tokens
        if call.output_tokens:
            attributes["gen_ai.usage.output_tokens"] = call.output_tokens
        span = self._tracer.start_span(
            f"chat {self._llm_model}",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=ended - int(call.duration_s * 1e9),
        )
        if call.result != "ok":
            span.set_attribute(
                "error.type", type(call.failure).__name__ if call.failure else call.result
            )
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=ended)

    def budget_exhausted(self, state: RequestState) -> None:
        self._event(state, "retry_budget.exhausted", {})

    def circuit_refused(self, state: RequestState) -> None:
        self._event(state, "circuit.refused", {})

    def sidecar_overloaded(self, state: RequestState) -> None:
        self._event(state, "sidecar.overloaded", {"sidecar.overload.reason": state.reason})

    def request_finished(self, state: RequestState) -> None:
        server = state.scratch.pop(_SERVER, None)
        if server is None:
            return
        self._end_attempt(state)
        repair = state.scratch.pop(_REPAIR, None)
        if repair is not None:
            repair.end()
        server.set_attributes(
            {
                "sidecar.outcome": state.outcome,
                "sidecar.attempts": state.attempts,
                "sidecar.trail": state.trail,
            }
        )
        if state.status:
            server.set_attribute("http.response.status_code", state.status)
        if state.status >= 500:
            server.set_attribute("error.type", str(state.status))
            server.set_status(Status(StatusCode.ERROR))
        state.exemplar = _exemplar(server)
        server.end()

    def _end_attempt(self, state: RequestState, reason: str = "", layer: str = "") -> None:
        """The last attempt's span, ended when its answer was, with what followed it."""
        pending = state.scratch.pop(_ATTEMPT, None)
        if pending is None:
            return
        span, ended = pending
        if reason:
            span.set_attribute("sidecar.retry.reason", reason)
        if layer:
            span.set_attribute("sidecar.repair.layer", layer)
        span.end(end_time=ended)

    def _event(self, state: RequestState, name: str, attributes: dict[str, Any]) -> None:
        server = state.scratch.get(_SERVER)
        if server is not None:
            server.add_event(name, attributes)


def _coercion_event(span: Span, state: RequestState) -> None:
    if state.layer == "coercion":
        span.add_event("coercion.applied", {"sidecar.repair.fields": list(state.changed)})


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
