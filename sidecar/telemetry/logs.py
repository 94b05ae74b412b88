"""The structlog lines each event writes (field names are part of the contract)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import structlog

from sidecar.outcomes import GAVE_UP, Outcome
from sidecar.telemetry.contract import Sink
from sidecar.telemetry.events import (
    AttemptFinished,
    CircuitRefused,
    CircuitStateReported,
    LlmCallFinished,
    LlmFormatRefused,
    LlmReask,
    PayloadRepaired,
    RepairedRetry,
    RepairRefused,
    RequestFinished,
    RequestReceived,
    RetryScheduled,
    SchemaUnavailable,
    SessionReopened,
    SidecarOverloaded,
    StateError,
)
from sidecar.tool.envelopes import ToolFailure

# An open circuit refuses every request at once: one line per tool per interval, with
# the number refused, says as much as thousands of lines would.
CIRCUIT_REFUSALS_INTERVAL_S = 10.0
_CIRCUIT_CLOSED = 0

# Saturation can repeat thousands of times a second; one line per this many seconds says it.
_OVERLOAD_LOG_INTERVAL_S = 10.0


class _Throttle:
    """Counts occurrences and says when one should be logged: the first, then at most one
    per ``interval_s``, carrying how many happened since the last one logged."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = 0.0
        self._count = 0

    def count(self) -> int:
        """0 when this occurrence stays silent, else how many to report (itself included)."""
        self._count += 1
        now = self._clock()
        if now < self._next_at:
            return 0
        self._next_at = now + self._interval_s
        count, self._count = self._count, 0
        return count

    def flush(self) -> int:
        """How many happened since the last one logged, now to report; the next occurrence
        is logged at once."""
        count, self._count, self._next_at = self._count, 0, 0.0
        return count


class LogSink(Sink):
    """One structlog line per event worth reading; repeated alarms are throttled."""

    def __init__(
        self, *, access_log: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = structlog.get_logger("sidecar")
        self._access_log = access_log
        self._clock = clock
        self._refusals: dict[tuple[str, str], _Throttle] = {}
        self._overloads = _Throttle(_OVERLOAD_LOG_INTERVAL_S)
        self._state_errors = _Throttle(_OVERLOAD_LOG_INTERVAL_S, clock)

    def request_received(self, event: RequestReceived) -> None:
        log = self._at_debug()
        if log is not None:
            log.debug("request_received", route=event.route, method=event.method)

    def attempt_finished(self, event: AttemptFinished) -> None:
        log = self._at_debug()
        if log is None:
            return
        status = _status_of(event.label)
        outcome = {"status": status} if status else {"reason": event.label}
        log.debug(
            "upstream_attempt",
            route=event.route,
            attempt=event.attempt,
            duration_ms=round(event.duration_s * 1000, 1),
            **outcome,
            **_failure_fields(event.failure),
        )

    def retry_scheduled(self, event: RetryScheduled) -> None:
        self.log.info(
            "retry_scheduled",
            route=event.route,
            attempt=event.attempt,
            status=_status_of(event.label),
            reason=event.reason,
            delay_ms=round(event.wait.seconds * 1000),
            wait_source=event.wait.source,
            **_failure_fields(event.failure),
        )

    def repaired_retry(self, event: RepairedRetry) -> None:
        self.log.info(
            "retry_scheduled",
            route=event.route,
            attempt=event.attempt,
            status=_status_of(event.label),
            reason="repaired",
            layer=event.layer,
            delay_ms=0,
        )

    def payload_repaired(self, event: PayloadRepaired) -> None:
        self.log.info(
            "payload_repaired", route=event.route, layer=event.layer, fields=event.fields[:50]
        )

    def repair_refused(self, event: RepairRefused) -> None:
        fields = {"fields": event.fields[:50]} if event.fields else {}
        self.log.info(
            "repair_refused", route=event.route, layer=event.layer, reason=event.reason, **fields
        )

    def llm_reask(self, event: LlmReask) -> None:
        self.log.info("llm_reask", route=event.route, reason=event.reason)

    def llm_call_finished(self, event: LlmCallFinished) -> None:
        """A call that failed is logged with its error's class and the HTTP status it carries."""
        if event.result != "ok":
            self.log.warning(
                "llm_request_failed", result=event.result, **_llm_failure_fields(event.failure)
            )

    def llm_format_refused(self, event: LlmFormatRefused) -> None:
        self.log.warning(
            "llm_response_format_refused",
            response_format=event.response_format,
            status=event.status,
        )

    def session_reopened(self, event: SessionReopened) -> None:
        if event.opened:
            self.log.info("mcp_session_reopened", route=event.route)
        else:
            self.log.warning("mcp_session_lost", route=event.route)

    def schema_unavailable(self, event: SchemaUnavailable) -> None:
        self.log.warning("schema_unavailable", route=event.route, reason=event.reason)

    def sidecar_overloaded(self, event: SidecarOverloaded) -> None:
        """Logged once per interval."""
        count = self._overloads.count()
        if count:
            self.log.error(
                "sidecar_overloaded", route=event.route or None, reason=event.reason, count=count
            )

    def state_error(self, event: StateError) -> None:
        """Logged once per interval, with the number of failed store calls since."""
        count = self._state_errors.count()
        if count:
            self.log.warning(
                "state_store_unavailable",
                op=event.op,
                error=type(event.error).__name__,
                count=count,
            )

    def circuit_state(self, event: CircuitStateReported) -> None:
        """Once the circuit closes, the refusals not yet logged are (half-open, it still
        refuses)."""
        refusals = self._refusals.get((event.route, event.tool))
        if event.state == _CIRCUIT_CLOSED and refusals is not None:
            self._log_refusals(event.route, event.tool, refusals.flush())

    def circuit_refused(self, event: CircuitRefused) -> None:
        """One ``circuit_refusals`` line with the number refused since the tool's previous
        line: at once for the first, then at most every ``CIRCUIT_REFUSALS_INTERVAL_S``.
        Each request is still counted in ``sidecar_requests_total``."""
        key = (event.route, event.tool)
        refusals = self._refusals.get(key)
        if refusals is None:
            refusals = self._refusals[key] = _Throttle(CIRCUIT_REFUSALS_INTERVAL_S, self._clock)
        self._log_refusals(event.route, event.tool, refusals.count())

    def _log_refusals(self, route: str, tool: str, count: int) -> None:
        if count:
            named = {"tool": tool} if tool else {}
            self.log.warning("circuit_refusals", route=route, **named, count=count)

    def request_finished(self, event: RequestFinished) -> None:
        line = _line_at_info(event.outcome, event.attempts, event.trail)
        log = self.log.bind()
        if line is None and not self._access_log and not log.is_enabled_for(logging.DEBUG):
            return
        fields = {
            "route": event.route,
            "method": event.method,
            "outcome": event.outcome,
            "status": event.status,
            "attempt": event.attempts,
            "duration_ms": round(event.duration_s * 1000, 1),
        }
        if line is not None:
            log.info(line, trail=event.trail, **fields)
            if line == "request_done":
                return
        emit = log.info if self._access_log else log.debug
        emit("request_done", **fields)

    def _at_debug(self) -> Any:
        """The logger when debug lines are written, else ``None``: their fields are built
        only then (at info, building them for nothing cost ~29k instructions per request).
        Asked each time, as structlog's configuration may change after the sink is made;
        through ``bind()``, the proxy's own method: any other attribute of it costs a
        failed look-up before ``__getattr__`` (~1 µs against 0.3)."""
        log = self.log.bind()
        return log if log.is_enabled_for(logging.DEBUG) else None


def _line_at_info(outcome: str, attempts: int, trail: str) -> str | None:
    """The line a request's end writes at info, whatever the access log says: how a
    recovery ended, or for any other end but success ``request_done`` with its trail (the
    tool's verdict on a first answer, a refusal of the sidecar's own). The circuit's and the
    overload's refusals have throttled lines of their own, and write none each."""
    if outcome == Outcome.RECOVERED:
        return "recovery_succeeded"
    # A request that was never tried (a refusal) did not try to recover either, and
    # "not-retryable" on a first answer is the tool's verdict, not a failed recovery.
    tried_to_recover = attempts > 1 or trail.endswith("repair=none")
    if attempts and outcome in GAVE_UP and (outcome != Outcome.NOT_RETRYABLE or tried_to_recover):
        return "recovery_failed"
    if outcome in (Outcome.OK, Outcome.OVERLOADED):
        return None
    if not attempts and outcome == Outcome.UNREACHABLE:
        return None  # the open circuit's refusal
    return "request_done"


def _status_of(label: str) -> int | None:
    """An attempt label is a status code, or an error kind such as ``connect_error``."""
    return int(label) if label.isdigit() else None


def _llm_failure_fields(failure: BaseException | None) -> dict[str, Any]:
    """The error's class and HTTP status. A foreign message is left out: the model's server
    writes it and may echo the prompt or its own URL; the sidecar's own refusals name
    the guardrail their answer broke."""
    if failure is None:
        return {}
    fields: dict[str, Any] = {"error": type(failure).__name__}
    status = getattr(failure, "status_code", None)
    if isinstance(status, int):
        fields["status"] = status
    if type(failure).__module__.startswith("sidecar."):
        fields["reason"] = str(failure)
    return fields


def _failure_fields(failure: ToolFailure | None) -> dict[str, Any]:
    if failure is None:
        return {}
    fields = {"error_code": failure.code, "category": failure.category}
    return {name: value for name, value in fields.items() if value}
