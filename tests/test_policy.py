"""Backoff, stop rules, the retry budget, the circuit breaker and control headers: no I/O."""

from __future__ import annotations

import pytest

from sidecar.config import Tuning
from sidecar.outcomes import Outcome, Wait
from sidecar.retry.controls import request_controls
from sidecar.retry.guards.budget import RetryBudget
from sidecar.retry.guards.circuit import CircuitBreaker, CircuitState, Ticket, opens
from sidecar.retry.policy import Backoff, Limits, plan_wait
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
        "backoff": Backoff(1.0, 10.0, 2.0, "none", uniform=bottom),
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
    assert plan(retries_done=3) is Outcome.EXHAUSTED
    assert plan(retries_done=3, unreachable=True) is Outcome.UNREACHABLE
    assert plan(requested_s=61.0) is Outcome.NOT_RETRYABLE
    assert plan(requested_s=30.0, time_left_s=10.0) is Outcome.DEADLINE
    assert plan(time_left_s=0.5) is Outcome.DEADLINE


def test_requested_waits_are_spread_up_to_a_quarter_within_the_limits():
    stretching = Backoff(1.0, 10.0, 2.0, "none", uniform=top)
    assert plan(requested_s=8.0, backoff=stretching) == Wait(10.0, "retry_after")
    # Never past the longest wait honoured, never shorter than what the tool asked for.
    assert plan(requested_s=50.0, backoff=stretching) == Wait(60.0, "retry_after")
    assert plan(requested_s=59.0, backoff=stretching) == Wait(60.0, "retry_after")
    # No room before the deadline to spread: exactly the requested wait.
    assert plan(requested_s=8.0, backoff=stretching, time_left_s=9.0) == Wait(8.0, "retry_after")
    assert plan(requested_s=0.0, backoff=stretching) == Wait(0.0, "retry_after")


def try_spend(budget: RetryBudget) -> bool:
    """What the engine does before a retry: spend the budget when it has room."""
    if not budget.available():
        return False
    budget.spend()
    return True


def test_budget_allows_the_floor_plus_a_ratio_of_requests_in_the_window():
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=0.1, clock=clock)  # floor: 1 per 10 s
    for _ in range(10):
        budget.record_request()
    spent = sum(try_spend(budget) for _ in range(10))
    assert spent == 3  # 0.2 * 10 + 1

    clock.now += 10.1  # the window has moved past every request and retry
    budget.record_request()
    assert try_spend(budget) is True
    assert try_spend(budget) is True  # floor 1 + 0.2 of 1 request
    assert try_spend(budget) is False


def breaker(clock: FakeClock, **overrides) -> CircuitBreaker:
    settings = {
        "min_failures": 5,
        "min_calls": 0,
        "failure_rate": 0.5,
        "window_s": 30.0,
        "open_s": 5.0,
        "probes": 2,
        "clock": clock,
    }
    return CircuitBreaker(**{**settings, **overrides})


def finish(circuit: CircuitBreaker, failed: bool, count: int = 1) -> None:
    """``count`` requests admitted now and ended with this verdict."""
    for _ in range(count):
        ticket = circuit.admit()
        assert isinstance(ticket, Ticket)
        circuit.record(ticket, failed)


def due_for_probes(clock: FakeClock, **overrides) -> CircuitBreaker:
    """A circuit that opened on five failed requests and whose open time has passed."""
    circuit = breaker(clock, **overrides)
    finish(circuit, failed=True, count=5)
    clock.now += 5
    return circuit


def test_circuit_counts_requests_and_opens_on_a_failure_rate_past_a_minimum():
    circuit = breaker(FakeClock())
    finish(circuit, failed=False, count=20)
    finish(circuit, failed=True, count=5)  # 5 of 25: a minority
    assert circuit.state is CircuitState.CLOSED
    finish(circuit, failed=True, count=15)  # 20 of 40: half
    assert circuit.state is CircuitState.OPEN
    assert circuit.admit() == 5.0


def test_circuit_needs_the_minimum_number_of_failed_requests():
    circuit = breaker(FakeClock())
    finish(circuit, failed=True, count=4)  # 100% failed, but only 4
    assert circuit.state is CircuitState.CLOSED
    finish(circuit, failed=True)
    assert circuit.state is CircuitState.OPEN


@pytest.mark.parametrize(
    ("verdicts", "state"),
    [
        # One agent's burst: 5 of its first 6 calls failed. Too few calls to judge.
        ("FFFFFS", CircuitState.CLOSED),
        # Every call failed, but 19 are still short of the 20 the rate needs.
        ("F" * 19, CircuitState.CLOSED),
        ("F" * 20, CircuitState.OPEN),
        # A tool whose calls fail half the time but are recovered by retries: every
        # request is a success (the engine records RECOVERED as one).
        ("S" * 40, CircuitState.CLOSED),
        # 20 calls in the window, 10 failed: half, the rate.
        ("SF" * 10, CircuitState.OPEN),
        ("SSF" * 7, CircuitState.CLOSED),  # a third failed
        # The 20th call reaches the evidence; the rate was past 0.5 all along.
        ("S" * 9 + "F" * 11, CircuitState.OPEN),
    ],
)
def test_circuit_judges_a_failure_rate_only_over_enough_calls(verdicts, state):
    circuit = breaker(FakeClock(), min_calls=20)
    for verdict in verdicts:
        finish(circuit, failed=verdict == "F")
    assert circuit.state is state


@pytest.mark.parametrize(
    ("requests", "failures", "min_calls", "min_failures", "rate", "opens_it"),
    [
        (20, 10, 20, 5, 0.5, True),
        (19, 19, 20, 5, 0.5, False),  # not enough calls, whatever the rate
        (6, 5, 20, 5, 0.5, False),
        (6, 5, 0, 5, 0.5, True),  # min_calls 0: the rate counts from the first call
        # A low rate: the failures' floor keeps a few failed calls from opening it.
        (40, 4, 20, 5, 0.1, False),
        (40, 5, 20, 5, 0.1, True),
        (40, 19, 20, 5, 0.5, False),
        (40, 20, 20, 5, 0.5, True),
    ],
)
def test_the_opening_rule_is_calls_and_failures_and_rate(
    requests, failures, min_calls, min_failures, rate, opens_it
):
    assert opens(requests, failures, min_calls, min_failures, rate) is opens_it


def test_a_fleets_totals_are_judged_by_the_same_rule():
    """Another replica's calls count as evidence: with the fleet's 19 in the window, this
    process's first failed call is the 20th."""
    circuit = breaker(FakeClock(), min_calls=20)
    ticket = circuit.admit()
    assert isinstance(ticket, Ticket)
    circuit.record(ticket, failed=True, fleet_totals=(19, 9))
    assert circuit.state is CircuitState.CLOSED
    ticket = circuit.admit()
    assert isinstance(ticket, Ticket)
    circuit.record(ticket, failed=True, fleet_totals=(20, 10))
    assert circuit.state is CircuitState.OPEN


def test_circuit_window_forgets_old_verdicts():
    clock = FakeClock()
    circuit = breaker(clock)
    finish(circuit, failed=True, count=4)
    clock.now += 31
    finish(circuit, failed=True, count=4)
    assert circuit.state is CircuitState.CLOSED


def test_half_open_lets_a_few_probes_through_and_closes_after_they_succeed():
    circuit = due_for_probes(FakeClock())
    first, second = circuit.admit(), circuit.admit()
    assert isinstance(first, Ticket) and first.probe
    assert isinstance(second, Ticket) and second.probe
    assert circuit.state is CircuitState.HALF_OPEN
    assert circuit.admit() == 0.0  # the probes are out
    circuit.record(first, failed=False)
    assert circuit.state is CircuitState.HALF_OPEN
    circuit.record(second, failed=False)
    assert circuit.state is CircuitState.CLOSED
    finish(circuit, failed=True, count=4)  # a fresh window after closing
    assert circuit.state is CircuitState.CLOSED


def test_one_failed_probe_reopens_and_the_other_probe_no_longer_counts():
    circuit = due_for_probes(FakeClock())
    first, second = circuit.admit(), circuit.admit()
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    circuit.record(first, failed=True)
    assert circuit.state is CircuitState.OPEN
    circuit.record(second, failed=False)  # admitted before the circuit re-opened
    assert circuit.state is CircuitState.OPEN
    assert circuit.admit() == 5.0


def test_late_verdicts_from_an_older_generation_change_nothing():
    clock = FakeClock()
    circuit = breaker(clock)
    slow = circuit.admit()
    assert isinstance(slow, Ticket)
    finish(circuit, failed=True, count=5)
    assert circuit.state is CircuitState.OPEN
    circuit.record(slow, failed=False)  # a late success does not close an open circuit
    assert circuit.state is CircuitState.OPEN
    assert not circuit.allows_more(slow)

    clock.now += 5
    probes = [circuit.admit(), circuit.admit()]
    for probe in probes:
        assert isinstance(probe, Ticket)
        circuit.record(probe, failed=False)
    assert circuit.state is CircuitState.CLOSED
    circuit.record(slow, failed=True)  # nor does a late failure re-open a closed one
    assert circuit.allows_more(slow)
    finish(circuit, failed=True, count=4)
    assert circuit.state is CircuitState.CLOSED


def test_an_abandoned_probe_frees_its_place():
    circuit = due_for_probes(FakeClock(), probes=1)
    probe = circuit.admit()
    assert isinstance(probe, Ticket)
    assert circuit.admit() == 0.0
    circuit.abandon(probe)
    assert isinstance(circuit.admit(), Ticket)


def test_zero_failures_disables_the_breaker():
    circuit = breaker(FakeClock(), min_failures=0)
    finish(circuit, failed=True, count=100)
    assert circuit.state is CircuitState.CLOSED


@pytest.mark.parametrize(
    ("headers", "retries", "timeout_s", "window_s"),
    [
        ({}, 10, 120.0, 4.0),
        ({"X-Sidecar-Max-Retries": "1"}, 1, 120.0, 4.0),
        ({"X-Sidecar-Max-Retries": "30"}, 10, 120.0, 4.0),
        ({"X-Sidecar-Max-Retries": "-1"}, 10, 120.0, 4.0),
        ({"X-Sidecar-Max-Retries": "1e3"}, 10, 120.0, 4.0),
        ({"X-Sidecar-Max-Retries": "²"}, 10, 120.0, 4.0),
        # The agent's deadline is the whole request's, and the window ends by it.
        ({"X-Sidecar-Timeout-Ms": "9000"}, 10, 9.0, 4.0),
        ({"X-Sidecar-Timeout-Ms": "500"}, 10, 0.5, 0.5),
        ({"X-Sidecar-Timeout-Ms": "999999999"}, 10, 120.0, 4.0),
        ({"X-Sidecar-Timeout-Ms": "0"}, 10, 120.0, 4.0),
        ({"X-Sidecar-Timeout-Ms": "soon"}, 10, 120.0, 4.0),
    ],
)
def test_control_headers_only_lower_limits(headers, retries, timeout_s, window_s):
    controls = request_controls(Tuning(), headers)
    assert (controls.max_retries, controls.timeout_s) == (retries, timeout_s)
    assert controls.retry_window_s == window_s
