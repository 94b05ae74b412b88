"""A scripted run of requests through the telemetry hooks that moves every metric of the
contract: each label value the sinks map, observations on and between bucket bounds, an
exemplar on some, and series that go up and back down."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.outcomes import Wait
from sidecar.telemetry import Hooks
from sidecar.telemetry.events import Request
from sidecar.telemetry.metric_definitions import Metrics
from sidecar.telemetry.metrics import MetricsSink

# The ids a sampled span offers, as the trace sink's open spans give them.
EXEMPLAR = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}


class Sampled:
    """Requests to ``/sampled`` have a sampled span, ``EXEMPLAR``, as the trace sink's
    ``OpenSpans`` tell the hooks of a request whose span is sampled."""

    def trace_headers(self, request: Request, attempt: int) -> dict[str, str] | None:
        return None

    def exemplar(self, request: Request, attempt: int | None) -> dict[str, str] | None:
        return dict(EXEMPLAR) if request.route == "sampled" else None


def scenario_registry() -> CollectorRegistry:
    """A registry holding the sidecar's metrics after ``run_scenario``."""
    registry = CollectorRegistry()
    hooks = Hooks([MetricsSink(Metrics(registry))], Sampled())
    run_scenario(hooks)
    return registry


def run_scenario(hooks: Hooks) -> None:
    _first_attempt_answers(hooks)
    _retried_and_repaired(hooks)
    _llm_calls(hooks)
    _guards(hooks)
    _sampled(hooks)
    # Unmatched: counted under its route, never in flight.
    hooks.request_finished("(none)", "GET", "no-route", 404, 0, 0.0001, matched=False)
    # Still in flight when scraped.
    hooks.request_received("search", "GET")


def _first_attempt_answers(hooks: Hooks) -> None:
    # Durations on a bound (0.005), between bounds, past the last bound (+Inf only).
    for method, seconds in (("POST", 0.005), ("GET", 0.0051), ("BREW", 200.0)):
        hooks.request_received("weather", method)
        hooks.attempt_finished("weather", 1, "200", seconds, None)
        hooks.request_finished("weather", method, "ok", 200, 1, seconds + 0.001)


def _retried_and_repaired(hooks: Hooks) -> None:
    hooks.request_received("weather", "POST")
    hooks.attempt_finished("weather", 1, "503", 0.02, None)
    hooks.retry_scheduled("weather", 1, "503", "server_error", Wait(0.1, "backoff"), None)
    hooks.attempt_finished("weather", 2, "connect_error", 0.3, None)
    hooks.retry_scheduled("weather", 2, "connect_error", "connect_error", Wait(3, "backoff"), None)
    hooks.attempt_finished("weather", 3, "429", 0.04, None)
    hooks.retry_scheduled("weather", 3, "429", "rate_limited", Wait(61, "retry_after"), None)
    hooks.attempt_finished("weather", 4, "422", 0.05, None)
    hooks.repaired_retry("weather", 4, "422", "coercion")
    hooks.repair_result("weather", "coercion", "succeeded")
    hooks.attempt_finished("weather", 5, "cancelled", 0.5, None)
    hooks.attempt_finished("weather", 5, "200", 0.06, None)
    hooks.hedge_finished("weather", "won")
    hooks.request_finished("weather", "POST", "recovered", 200, 5, 64.5)

    hooks.request_received("search", "PUT")
    hooks.attempt_finished("search", 1, "400", 0.01, None)
    hooks.repair_refused("search", "llm", "out_of_scope", ("secret",))
    hooks.repair_refused("search", "llm", "invalid_json")
    hooks.llm_reask("search", "invalid_json")
    hooks.repair_result("search", "adjustment", "declined")
    hooks.repair_result("search", "llm", "failed")
    hooks.budget_exhausted("search")
    hooks.session_reopened("search", True)
    hooks.session_reopened("search", False)
    hooks.hedge_finished("search", "unanswered")
    hooks.request_finished("search", "PUT", "budget-exhausted", 400, 1, 0.75)


def _llm_calls(hooks: Hooks) -> None:
    hooks.llm_call_finished("ok", 0.1, prompt_tokens=120, completion_tokens=30)
    hooks.llm_call_finished("invalid", 0.9, prompt_tokens=7, response_format="json_schema")
    hooks.llm_call_finished("timeout", 31.0)


def _guards(hooks: Hooks) -> None:
    hooks.circuit_state("weather", 0, "/forecast")
    hooks.circuit_state("weather", 2, "/forecast")
    hooks.circuit_state("search", 1)
    hooks.state_error("get", ConnectionError("refused"))
    hooks.state_error("get", TimeoutError())
    hooks.state_error("incr", TimeoutError())


def _sampled(hooks: Hooks) -> None:
    hooks.request_received("sampled", "POST")
    hooks.attempt_finished("sampled", 1, "200", 0.2, None)
    hooks.request_finished("sampled", "POST", "ok", 200, 1, 0.25)
