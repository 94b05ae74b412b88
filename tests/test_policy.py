"""Backoff, stop rules, the retry budget, the circuit breaker and control headers: no I/O."""

from __future__ import annotations

import pytest

from sidecar.budget import RetryBudget
from sidecar.circuit import CircuitBreaker, CircuitState
from sidecar.controls import request_controls
from sidecar.policy import Backoff, Limits, Stop, Wait, plan_wait
from sidecar.settings import Tuning
from tests.conftest import FakeClock


def top(low: float, high: float) -> float:
    return high


def bottom(low: float, high: float) -> float:
    return low


@pytest.mark.parametrize(
    ("jitter", "uniform", "expected"),
    [
        ("none", top, [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]),
        ("full", top, [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]),
        ("full", bottom, [0.0] * 6),
        ("equal", bottom, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]),
        ("equal", top, [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]),
    ],
)
def test_exponential_backoff_with_jitter(jitter, uniform, expected):
    backoff = Backoff(base_s=1.0, cap_s=10.0, multiplier=2.0, jitter=jitter, uniform=uniform)
    assert [backoff.delay(n) for n in range(1, 7)] == expected


def test_decorrelated_jitter_grows_from_the_previous_wait_and_is_capped():
    backoff = Backoff(base_s=1.0, cap_s=10.0, multiplier=2.0, jitter="decorrelated", uniform=top)
    waits, previous = [], None
    for n in range(1, 5):
        previous = backoff.delay(n, previous)
        waits.append(previous)
    assert waits == [3.0, 9.0, 10.0, 10.0]
    assert Backoff(1.0, 10.0, 2.0, "decorrelated", bottom).delay(3, 9.0) == 1.0


def test_huge_retry_numbers_do_not_overflow():
    assert Backoff(1.0, 10.0, 100.0, "none").delay(10_000) == 10.0


def plan(**overrides):
    arguments = {
        "retries_done": 0,
        "limits": Limits(max_retries=3, max_retry_after_s=60.0),
        "requested_s": None,
        "backoff": Backoff(1.0, 10.0, 2.0, "none"),
        "previous_s": None,
        "time_left_s": 100.0,
        "unreachable": False,
    }
    return plan_wait(**{**arguments, **overrides})


def test_plan_wait_rules():
    assert plan() == Wait(1.0, "backoff")
    assert plan(retries_done=2) == Wait(4.0, "backoff")
    assert plan(requested_s=7.0) == Wait(7.0, "retry_after")
    assert plan(requested_s=0.0) == Wait(0.0, "retry_after")
    assert plan(retries_done=3) is Stop.EXHAUSTED
    assert plan(retries_done=3, unreachable=True) is Stop.UNREACHABLE
    assert plan(requested_s=61.0) is Stop.NOT_RETRYABLE
    assert plan(requested_s=30.0, time_left_s=10.0) is Stop.DEADLINE
    assert plan(time_left_s=0.5) is Stop.DEADLINE


def test_budget_allows_the_floor_plus_a_ratio_of_requests_in_the_window():
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=0.1, clock=clock)  # floor: 1 per 10 s
    for _ in range(10):
        budget.record_request()
    spent = sum(budget.try_spend() for _ in range(10))
    assert spent == 3  # 0.2 * 10 + 1

    clock.now += 10.1  # the window has moved past every request and retry
    budget.record_request()
    assert budget.try_spend() is True
    assert budget.try_spend() is True  # floor 1 + 0.2 of 1 request
    assert budget.try_spend() is False


def test_circuit_breaker_cycle():
    clock = FakeClock()
    circuit = CircuitBreaker(failures=2, open_s=5.0, clock=clock)

    assert circuit.admit() is None
    circuit.record(failed=True)
    assert circuit.state is CircuitState.CLOSED
    circuit.record(failed=False)  # a success resets the count
    circuit.record(failed=True)
    assert circuit.state is CircuitState.CLOSED
    circuit.record(failed=True)
    assert circuit.state is CircuitState.OPEN
    assert circuit.admit() == 5.0

    clock.now += 5
    assert circuit.admit() is None  # the probe
    assert circuit.state is CircuitState.HALF_OPEN
    assert circuit.admit() == 0.0  # one probe at a time
    circuit.record(failed=True)
    assert circuit.state is CircuitState.OPEN

    clock.now += 5
    assert circuit.admit() is None
    circuit.abandon()  # the probe's request went away: another may probe
    assert circuit.admit() is None
    circuit.record(failed=False)
    assert circuit.state is CircuitState.CLOSED
    assert circuit.admit() is None


def test_zero_failures_disables_the_breaker():
    circuit = CircuitBreaker(failures=0, open_s=5.0, clock=FakeClock())
    for _ in range(100):
        circuit.record(failed=True)
    assert circuit.admit() is None


@pytest.mark.parametrize(
    ("headers", "retries", "timeout_s"),
    [
        ({}, 3, 120.0),
        ({"X-Sidecar-Max-Retries": "1"}, 1, 120.0),
        ({"X-Sidecar-Max-Retries": "10"}, 3, 120.0),
        ({"X-Sidecar-Max-Retries": "-1"}, 3, 120.0),
        ({"X-Sidecar-Max-Retries": "1e3"}, 3, 120.0),
        ({"X-Sidecar-Max-Retries": "²"}, 3, 120.0),
        ({"X-Sidecar-Timeout-Ms": "500"}, 3, 0.5),
        ({"X-Sidecar-Timeout-Ms": "999999999"}, 3, 120.0),
        ({"X-Sidecar-Timeout-Ms": "0"}, 3, 120.0),
        ({"X-Sidecar-Timeout-Ms": "soon"}, 3, 120.0),
    ],
)
def test_control_headers_only_lower_limits(headers, retries, timeout_s):
    controls = request_controls(Tuning(), headers)
    assert (controls.max_retries, controls.timeout_s) == (retries, timeout_s)
