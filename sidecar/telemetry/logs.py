"""The structlog lines each stage writes (field names are part of the contract)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from sidecar.outcomes import GAVE_UP, Outcome
from sidecar.telemetry.contract import RequestState, Sink
from sidecar.tool.envelopes import ToolFailure

# An open circuit refuses every request at once: one line per route per interval, with
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
    """One structlog line per stage worth reading; repeated alarms are throttled."""

    def __init__(
        self, *, access_log: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = structlog.get_logger("sidecar")
        self._access_log = access_log
        self._clock = clock
        self._refusals: dict[str, _Throttle] = {}
        self._overloads = _Throttle(_OVERLOAD_LOG_INTERVAL_S)
        self._state_errors = _Throttle(_OVERLOAD_LOG_INTERVAL_S, clock)

    def request_received(self, state: RequestState) -> None:
        self.log.debug("request_received", route=state.route, method=state.method)

    def attempt_finished(self, state: RequestState) -> None:
        status = _status_of(state.label)
        outcome = {"status": status} if status else {"reason": state.label}
        self.log.debug(
            "upstream_attempt",
            route=state.route,
            attempt=state.attempt,
            duration_ms=round(state.attempt_s * 1000, 1),
            **outcome,
            **_failure_fields(state.failure),
        )

    def retry_scheduled(self, state: RequestState) -> None:
        assert state.wait is not None
        self.log.info(
            "retry_scheduled",
            route=state.route,
            attempt=state.attempt,
            status=_status_of(state.label),
            reason=state.reason,
            delay_ms=round(state.wait.seconds * 1000),
            wait_source=state.wait.source,
            **_failure_fields(state.failure),
        )

    def repaired_retry(self, state: RequestState) -> None:
        self.log.info(
            "retry_scheduled",
            route=state.route,
            attempt=state.attempt,
            status=_status_of(state.label),
            reason="repaired",
            layer=state.layer,
            delay_ms=0,
        )

    def payload_repaired(self, state: RequestState) -> None:
        self.log.info(
            "payload_repaired", route=state.route, layer=state.layer, fields=state.changed[:50]
        )

    def repair_refused(self, state: RequestState) -> None:
        self.log.info("repair_refused", route=state.route, layer=state.layer, reason=state.reason)

    def llm_reask(self, state: RequestState) -> None:
        self.log.info("llm_reask", route=state.route, reason=state.reason)

    def llm_request(self, state: RequestState) -> None:
        """A call that failed is logged with its error's class and the HTTP status it carries."""
        call = state.llm
        assert call is not None
        if call.result != "ok":
            self.log.warning(
                "llm_request_failed", result=call.result, **_llm_failure_fields(call.failure)
            )

    def schema_unavailable(self, state: RequestState) -> None:
        self.log.warning("schema_unavailable", route=state.route, reason=state.reason)

    def sidecar_overloaded(self, state: RequestState) -> None:
        """Logged once per interval."""
        count = self._overloads.count()
        if count:
            self.log.error(
                "sidecar_overloaded", route=state.route or None, reason=state.reason, count=count
            )

    def state_error(self, state: RequestState) -> None:
        """Logged once per interval, with the number of failed store calls since."""
        count = self._state_errors.count()
        if count:
            self.log.warning(
                "state_store_unavailable", op=state.reason, error=state.label, count=count
            )

    def circuit_state(self, state: RequestState) -> None:
        """Once the circuit closes, the refusals not yet logged are (half-open, it still
        refuses)."""
        refusals = self._refusals.get(state.route)
        if state.circuit == _CIRCUIT_CLOSED and refusals is not None:
            self._log_refusals(state.route, refusals.flush())

    def circuit_refused(self, state: RequestState) -> None:
        """One ``circuit_refusals`` line with the number refused since the route's previous
        line: at once for the first, then at most every ``CIRCUIT_REFUSALS_INTERVAL_S``.
        Each request is still counted in ``sidecar_requests_total``."""
        refusals = self._refusals.get(state.route)
        if refusals is None:
            refusals = self._refusals[state.route] = _Throttle(
                CIRCUIT_REFUSALS_INTERVAL_S, self._clock
            )
        self._log_refusals(state.route, refusals.count())

    def _log_refusals(self, route: str, count: int) -> None:
        if count:
            self.log.warning("circuit_refusals", route=route, count=count)

    def request_finished(self, state: RequestState) -> None:
        fields = {
            "route": state.route,
            "method": state.method,
            "outcome": state.outcome,
            "status": state.status,
            "attempt": state.attempts,
            "duration_ms": round(state.duration_s * 1000, 1),
        }
        attempts, outcome, trail = state.attempts, state.outcome, state.trail
        # A request that was never tried (a refusal) did not try to recover either.
        tried_to_recover = attempts > 1 or trail.endswith("repair=none")
        if outcome == "recovered":
            self.log.info("recovery_succeeded", trail=trail, **fields)
        elif (
            attempts
            and outcome in GAVE_UP
            # "not-retryable" on a first answer is the tool's verdict, not a failed recovery.
            and (outcome != Outcome.NOT_RETRYABLE or tried_to_recover)
        ):
            self.log.info("recovery_failed", trail=trail, **fields)
        emit = self.log.info if self._access_log else self.log.debug
        emit("request_done", **fields)


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
