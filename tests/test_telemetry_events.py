"""The telemetry contract's events: every hook makes one, and a sink is checked against them
when it is registered."""

from __future__ import annotations

import inspect

import pytest

from sidecar.telemetry import Hooks, Sink
from sidecar.telemetry.events import (
    ALL_EVENTS,
    AttemptFinished,
    CircuitRefused,
    CircuitStateReported,
)


class _Recorder(Sink):
    def __init__(self) -> None:
        self.seen: list[object] = []

    def circuit_state(self, event: CircuitStateReported) -> None:
        self._keep(event)

    def circuit_refused(self, event: CircuitRefused) -> None:
        self._keep(event)

    def _keep(self, event: object) -> None:
        self.seen.append(event)


class _Misspelled(Sink):
    def circuit_refsued(self, event: CircuitRefused) -> None:
        raise AssertionError("never called")


class _WrongEvent(Sink):
    def circuit_refused(self, event: AttemptFinished) -> None:
        raise AssertionError("never called")


class _ExtraParameter(Sink):
    def circuit_refused(self, event: CircuitRefused, extra: int) -> None:
        raise AssertionError("never called")


def test_every_hook_but_flush_and_close_makes_an_event_of_its_name():
    hooks = {
        name
        for name, _ in inspect.getmembers(Hooks, inspect.isfunction)
        if not name.startswith("_")
    }
    assert hooks - {"flush", "close"} == set(ALL_EVENTS)


def test_a_sink_gets_the_events_it_names_in_the_order_they_happen():
    recorder = _Recorder()
    hooks = Hooks([recorder])

    hooks.circuit_refused("weather")
    hooks.circuit_state("weather", 2)
    hooks.budget_exhausted("weather")  # no method of that name: not the recorder's business

    assert [type(event) for event in recorder.seen] == [CircuitRefused, CircuitStateReported]
    assert recorder.seen[1] == CircuitStateReported("weather", 2)


def test_a_circuit_state_is_an_event_only_when_it_changes():
    recorder = _Recorder()
    hooks = Hooks([recorder])

    for route, state, tool in [
        ("weather", 0, ""),
        ("weather", 0, ""),
        ("weather", 0, "/forecast"),  # another circuit: its first state is news
        ("weather", 2, ""),
        ("weather", 2, ""),
        ("weather", 0, ""),
        ("search", 0, ""),
    ]:
        hooks.circuit_state(route, state, tool)

    assert recorder.seen == [
        CircuitStateReported("weather", 0),
        CircuitStateReported("weather", 0, "/forecast"),
        CircuitStateReported("weather", 2),
        CircuitStateReported("weather", 0),
        CircuitStateReported("search", 0),
    ]


def test_a_misspelled_sink_method_is_refused_when_the_sink_is_registered():
    with pytest.raises(TypeError, match=r"_Misspelled\.circuit_refsued names no telemetry event"):
        Hooks([_Recorder(), _Misspelled()])


@pytest.mark.parametrize("sink", [_WrongEvent, _ExtraParameter])
def test_a_sink_method_must_take_the_event_it_names(sink):
    with pytest.raises(TypeError, match=r"circuit_refused must take one CircuitRefused"):
        Hooks([sink()])


def test_events_are_frozen():
    event = CircuitStateReported("weather", 0)
    with pytest.raises(AttributeError):
        event.state = 2
