"""Whole request lives through the retry machine, as a table: no sockets, no event loop.

Each row is one life, told as what the world answers each time the machine asks (h11's and
tenacity's way): an attempt's answer, the fleet's cooldown, the repair layers' answer, or
the agent's cancellation. The driver plays the engine's part with an injected clock, the
real budget and circuit, and checks the actions, the trail and the result.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from sidecar.bugs import SidecarBug
from sidecar.outcomes import AttemptError, NoAnswer, Outcome
from sidecar.repair.payload import Payload
from sidecar.retry.guards.budget import RetryBudget
from sidecar.retry.guards.circuit import EVIDENCE, CircuitBreaker, CircuitState, Ticket
from sidecar.retry.machine import RetryMachine
from sidecar.retry.phases import AWAITS, EVENTS, MachineEvent, OutOfTurn, Phase
from sidecar.retry.policy import Backoff, Limits
from sidecar.retry.steps import (
    AttemptJudged,
    Command,
    Paused,
    Prepare,
    ReadCooldown,
    Relayed,
    ReopenSession,
    Repair,
    RepairJudged,
    Report,
    ReportBudgetExhausted,
    ReportCircuitRefused,
    Send,
    SendHedged,
    Settle,
    ShareCooldown,
    Terms,
    Unanswered,
    UsePayload,
    WaitCooldown,
    WaitRetry,
)

RETRY_ON = frozenset({500, 502, 503, 504})
# No jitter, and requested waits not stretched: every wait below is exact.
BACKOFF = Backoff(base_s=0.5, cap_s=10.0, multiplier=2.0, jitter="none", uniform=lambda a, b: a)
ATTEMPT_S = 0.05  # what an attempt takes unless its token says otherwise
# A validation error as FastAPI's problem details say it: what asks for a repair.
VALIDATION = (
    b'{"type": "about:blank", "title": "Unprocessable Entity", "status": 422, '
    b'"detail": "lat: Input should be a valid number"}'
)
WALL = 1_700_000_000.0  # the Unix time the machine reads a Retry-After date against


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Handle:
    """The tool's answer as the machine reads and holds it."""

    label: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = True
    discarded: bool = False
    slow: bool = False
    broken: bool = False
    resumed: bool = False

    @property
    def status(self) -> int:
        return int(self.label)

    @property
    def decisive(self) -> bool:
        return self.complete

    def judged(self) -> tuple[bytes, str | None]:
        return self.body, None

    def document(self) -> object:
        return None

    def discard(self) -> None:
        self.discarded = True


@dataclass(frozen=True)
class Life:
    """One request's life: the world's answers in order, and what the machine made of it."""

    name: str
    world: tuple[str, ...]
    actions: str  # the kinds of action the machine asked for, in order
    trail: str
    outcome: Outcome
    attempts: int
    max_retries: int = 3
    timeout_s: float = 10.0
    budget_per_s: float = 10.0  # the retry budget's floor; 0: no retries at all
    safe_to_repeat: bool = True
    hedge_after_s: float = 0.0
    shares_cooldowns: bool = False
    streamed: bool = False
    circuit_open: bool = False  # before the request
    trip_in_wait: bool = False  # other requests' failures open it while this one waits
    answer: str | None = None  # the label of the tool's answer that goes back
    error: AttemptError | None = None
    open_for_s: float | None = None
    settled: str = ""  # how the circuit counts it: "failed", "ok", "" for not at all
    session: bool = False  # an MCP request on a session the sidecar may open again
    beyond_window_s: float = 0.0  # how much longer than the retry window the deadline is
    tool_up: bool = False  # the tool's recent requests show it answering


def answer_of(token: str) -> Handle | NoAnswer:
    """An attempt's answer: ``503``, ``429 retry-after=1``, ``422`` (a validation error),
    or an ``AttemptError``'s value."""
    label, _, asked = token.partition(" retry-after=")
    if not label.isdigit():
        return NoAnswer(AttemptError(label))
    headers = {"Retry-After": asked} if asked else {}
    return Handle(label, headers, VALIDATION if label == "422" else b"")


def circuit_ticket(circuit: CircuitBreaker) -> Ticket:
    ticket = circuit.admit()
    assert isinstance(ticket, Ticket)
    return ticket


def circuit_for(clock: Clock, min_failures: int = 1) -> CircuitBreaker:
    return CircuitBreaker(
        min_failures=min_failures,
        min_calls=1,
        failure_rate=0.5,
        window_s=10.0,
        open_s=30.0,
        probes=1,
        clock=clock,
    )


def trip(circuit: CircuitBreaker) -> None:
    """Other requests' failures open the circuit."""
    ticket = circuit.admit()
    assert not isinstance(ticket, float)
    circuit.record(ticket, failed=True)
    assert circuit.state is CircuitState.OPEN


def machine_for(life: Life, clock: Clock) -> tuple[RetryMachine[Handle], CircuitBreaker]:
    terms = Terms(
        limits=Limits(life.max_retries, 30.0),
        backoff=BACKOFF,
        deadline=clock() + life.timeout_s + life.beyond_window_s,
        retry_until=clock() + life.timeout_s,
        per_try_s=2.0,
        safe_to_repeat=life.safe_to_repeat,
        replay_always=False,
        hedge_after_s=life.hedge_after_s,
        llm_max_repairs=1,
        tool="weather",
        path="/weather/current",
        shares_cooldowns=life.shares_cooldowns,
        retry_on_status=RETRY_ON,
        session_reopenable=life.session,
    )
    circuit = circuit_for(clock, min_failures=0 if life.tool_up else 1)
    if life.tool_up:
        for _ in range(EVIDENCE):
            circuit.record(circuit_ticket(circuit), failed=False)
    if life.circuit_open:
        trip(circuit)
    budget = RetryBudget(1.0 if life.budget_per_s else 0.0, life.budget_per_s, clock)
    machine = RetryMachine(terms, circuit=circuit, budget=budget, clock=clock, wall=lambda: WALL)
    return machine, circuit


Result = Relayed[Handle] | Unanswered | Paused
ENDS = (Relayed, Unanswered, Paused)


@dataclass
class Played:
    actions: list[str]
    result: Result
    handles: list[Handle]
    # What the machine was given to read the time with, held by nothing the caller keeps:
    # alive for as long as the machine is (a compiled machine takes no weak reference).
    clock: weakref.ref[Clock]


def play(life: Life) -> Played:
    """Drive ``life`` through the machine, answering each command from its world and
    writing down the reports it leaves (but the attempts judged, one per attempt)."""
    clock = Clock()
    machine, circuit = machine_for(life, clock)
    world: Iterator[str] = iter(life.world)
    actions: list[str] = []
    handles: list[Handle] = []

    def answer(copy: Send, token: str) -> Command[Handle]:
        seconds = token.rpartition(" +")[2] if " +" in token else ""
        token = token.partition(" +")[0]
        clock.now += float(seconds.rstrip("s")) if seconds else ATTEMPT_S
        answered = answer_of(token)
        if isinstance(answered, Handle):
            handles.append(answered)
        return machine.answered(copy, answered)

    command: Command[Handle] | Result = machine.start()
    while True:
        actions.extend(
            reported(report) for report in machine.outbox if not isinstance(report, AttemptJudged)
        )
        machine.outbox.clear()
        if isinstance(command, ENDS):
            break
        actions.append(type(command).__name__)
        if isinstance(command, Settle):
            actions[-1] = f"Settle:{'failed' if command.failed else 'ok'}"
            command = machine.settled()
            continue
        if isinstance(command, Prepare):
            command = machine.prepared(None if life.streamed else Payload(b'{"lat": "35.6"}'))
            continue
        asks = Send | SendHedged | ReadCooldown | Repair | ReopenSession
        token = next(world) if isinstance(command, asks) else ""
        if token == "cancel":
            actions.append("cancelled")
            command = machine.cancelled()
        elif isinstance(command, Send):
            command = answer(command, token)
        elif isinstance(command, SendHedged):
            clock.now += command.after_s
            copy = machine.hedge_due()
            actions.append("hedge" if copy else "no hedge")
            command = answer(copy or command.first, token)
        elif isinstance(command, WaitRetry | WaitCooldown):
            seconds = command.wait.seconds if isinstance(command, WaitRetry) else command.seconds
            clock.now += seconds
            if life.trip_in_wait:
                trip(circuit)
            command = machine.slept()
        elif isinstance(command, ReadCooldown):
            command = machine.cooldown_read(float(token.removeprefix("cooldown=")))
        elif isinstance(command, ReopenSession):
            command = machine.reopened(token == "reopened")
        else:
            assert isinstance(command, Repair)
            layer = token.removeprefix("repair=")
            if layer == "none":
                command = machine.repaired(None, None, False, 0)
            else:
                payload = Payload(b'{"lat": 35.6}', (*command.payload.layers, layer))
                command = machine.repaired(payload, layer, False, 0)
    assert machine.trail == command.trail
    assert machine.phase is Phase.ENDED
    return Played(actions, command, handles, weakref.ref(clock))


def reported(report: Report) -> str:
    """A report, as the table writes it."""
    if isinstance(report, ShareCooldown):
        return f"ShareCooldown:{report.seconds:g}s"
    if isinstance(report, UsePayload):
        return f"UsePayload:{report.layer}"
    if isinstance(report, RepairJudged):
        return f"RepairJudged:{report.layer}:{report.result}"
    assert isinstance(report, ReportBudgetExhausted | ReportCircuitRefused)
    return type(report).__name__


LIVES = [
    Life("first answer ok", ("200",), "Prepare Send Settle:ok", "200", Outcome.OK, 1,
         answer="200", settled="ok"),
    Life("503, wait, 200", ("503", "200"),
         "Prepare Send WaitRetry Send Settle:ok",
         "503 backoff=0.5s, 200", Outcome.RECOVERED, 2, answer="200", settled="ok"),
    Life("429 with Retry-After, then 200", ("429 retry-after=1", "200"),
         "Prepare Send WaitRetry Send Settle:ok",
         "429 retry_after=1s, 200", Outcome.RECOVERED, 2, answer="200", settled="ok"),
    Life("Retry-After past the longest wait honoured", ("429 retry-after=120",),
         "Prepare Send Settle:ok",
         "429 stop=not-retryable", Outcome.NOT_RETRYABLE, 1, answer="429", settled="ok"),
    Life("validation error, repaired, 200", ("422", "repair=coercion", "200"),
         "Prepare Send Repair UsePayload:coercion Send RepairJudged:coercion:succeeded Settle:ok",
         "422 repair=coercion, 200", Outcome.RECOVERED, 2, answer="200", settled="ok"),
    Life("validation error no layer can repair", ("422", "repair=none"),
         "Prepare Send Repair Settle:ok",
         "422 repair=none", Outcome.NOT_RETRYABLE, 1, answer="422", settled="ok"),
    Life("circuit open: no attempt", (), "ReportCircuitRefused", "circuit_open",
         Outcome.UNREACHABLE, 0, circuit_open=True, open_for_s=30.0),
    Life("circuit opens during the wait: the 503 goes back", ("503",),
         "Prepare Send WaitRetry Settle:failed",
         "503 backoff=0.5s, circuit_open", Outcome.EXHAUSTED, 1, answer="503",
         trip_in_wait=True, settled="failed"),
    Life("hedge won", ("200",), "Prepare SendHedged hedge Settle:ok",
         "hedge=0.2s, 200", Outcome.OK, 2, hedge_after_s=0.2, answer="200", settled="ok"),
    Life("hedge not paid for: the budget is spent", ("200",),
         "Prepare SendHedged no hedge Settle:ok",
         "200", Outcome.OK, 1, hedge_after_s=0.2, budget_per_s=0.0, answer="200", settled="ok"),
    Life("hedge never for a call not safe to repeat", ("200",), "Prepare Send Settle:ok",
         "200", Outcome.OK, 1, hedge_after_s=0.2, safe_to_repeat=False, answer="200",
         settled="ok"),
    Life("budget spent", ("503",), "Prepare Send ReportBudgetExhausted Settle:failed",
         "503 stop=budget-exhausted", Outcome.BUDGET, 1, budget_per_s=0.0, answer="503",
         settled="failed"),
    Life("deadline: the next wait would outlast it", ("503", "503"),
         "Prepare Send WaitRetry Send Settle:failed",
         "503 backoff=0.5s, 503 stop=deadline", Outcome.DEADLINE, 2, timeout_s=1.0,
         answer="503", settled="failed"),
    Life("timeout cut by the deadline", ("503 +0.1s", "timeout +0.8s"),
         "Prepare Send WaitRetry Send Settle:failed",
         "503 backoff=0.5s, timeout stop=deadline", Outcome.DEADLINE, 2, timeout_s=1.4,
         answer="503", settled="failed"),
    Life("retries exhausted", ("503", "503", "503"),
         "Prepare Send WaitRetry Send WaitRetry Send Settle:failed",
         "503 backoff=0.5s, 503 backoff=1s, 503 stop=exhausted", Outcome.EXHAUSTED, 3,
         max_retries=2, answer="503", settled="failed"),
    Life("a tool that shows it answers is retried past three, within the cap",
         ("503", "503", "503", "503", "503", "200"),
         "Prepare Send WaitRetry Send WaitRetry Send WaitRetry Send WaitRetry Send WaitRetry "
         "Send Settle:ok",
         "503 backoff=0.5s, 503 backoff=1s, 503 backoff=2s, 503 backoff=4s, 503 backoff=8s, 200",
         Outcome.RECOVERED, 6, max_retries=10, timeout_s=60.0, answer="200", settled="ok",
         tool_up=True),
    Life("one with no such evidence gets three, as in 0.5", ("503", "503", "503", "503"),
         "Prepare Send WaitRetry Send WaitRetry Send WaitRetry Send Settle:failed",
         "503 backoff=0.5s, 503 backoff=1s, 503 backoff=2s, 503 stop=exhausted",
         Outcome.EXHAUSTED, 4, max_retries=10, timeout_s=60.0, answer="503", settled="failed"),
    Life("never connected", ("connect_error", "connect_error"),
         "Prepare Send WaitRetry Send Settle:failed",
         "connect_error backoff=0.5s, connect_error stop=unreachable", Outcome.UNREACHABLE, 2,
         max_retries=1, error=AttemptError.CONNECT, settled="failed"),
    Life("a timeout of a call not safe to repeat", ("timeout",), "Prepare Send Settle:failed",
         "timeout stop=not_replayable", Outcome.NOT_RETRYABLE, 1, safe_to_repeat=False,
         error=AttemptError.TIMEOUT, settled="failed"),
    Life("a streamed body goes once", ("503",), "Prepare Send Settle:failed",
         "503 stop=not_replayable", Outcome.NOT_RETRYABLE, 1, streamed=True, answer="503",
         settled="failed"),
    Life("cancelled during an attempt", ("cancel",), "Prepare Send cancelled",
         "stop=cancelled", Outcome.DEADLINE, 1, error=AttemptError.TIMEOUT),
    Life("cancelled after a 503: the 503 goes back", ("503", "cancel"),
         "Prepare Send WaitRetry Send cancelled",
         "503 backoff=0.5s, stop=cancelled", Outcome.DEADLINE, 2, answer="503"),
    Life("MCP session lost, opened again, 200", ("404", "reopened", "200"),
         "Prepare Send ReopenSession Send Settle:ok",
         "404 session=reopened, 200", Outcome.RECOVERED, 2, answer="200", settled="ok",
         session=True, budget_per_s=0.0),
    Life("MCP session lost and not opened again: the 404 goes back", ("404", "not reopened"),
         "Prepare Send ReopenSession Settle:ok",
         "404", Outcome.NOT_RETRYABLE, 1, answer="404", settled="ok", session=True),
    Life("MCP session lost again on the new one: opened once more", ("404", "reopened", "404",
         "reopened", "200"),
         "Prepare Send ReopenSession Send ReopenSession Send Settle:ok",
         "404 session=reopened, 404 session=reopened, 200", Outcome.RECOVERED, 3, answer="200",
         settled="ok", session=True),
    Life("a session lost each time it is opened: the fourth 404 goes back",
         ("404", "reopened", "404", "reopened", "404", "reopened", "404"),
         "Prepare Send ReopenSession Send ReopenSession Send ReopenSession Send Settle:ok",
         "404 session=reopened, 404 session=reopened, 404 session=reopened, 404",
         Outcome.NOT_RETRYABLE, 4, answer="404", settled="ok", session=True),
    Life("opened again, then not: the second 404 goes back",
         ("404", "reopened", "404", "not reopened"),
         "Prepare Send ReopenSession Send ReopenSession Settle:ok",
         "404 session=reopened, 404", Outcome.NOT_RETRYABLE, 2, answer="404", settled="ok",
         session=True),
    Life("a lost session's request whose body streamed cannot go again: its 404 goes back",
         ("404",), "Prepare Send Settle:ok", "404", Outcome.NOT_RETRYABLE, 1, answer="404",
         settled="ok", session=True, streamed=True),
    Life("a 404 without a session is the tool's word", ("404",), "Prepare Send Settle:ok",
         "404", Outcome.NOT_RETRYABLE, 1, answer="404", settled="ok"),
    Life("the fleet's cooldown waited out", ("cooldown=2", "cooldown=0", "200"),
         "ReadCooldown WaitCooldown ReadCooldown Prepare Send Settle:ok",
         "cooldown=2s, 200", Outcome.OK, 1, shares_cooldowns=True, answer="200", settled="ok"),
    Life("cancelled while waiting out the fleet's cooldown", ("cooldown=2", "cancel"),
         "ReadCooldown WaitCooldown ReadCooldown cancelled",
         "cooldown=2s, stop=cancelled", Outcome.DEADLINE, 0, shares_cooldowns=True,
         error=AttemptError.TIMEOUT),
    Life("a cooldown longer than the request may wait", ("cooldown=60",), "ReadCooldown",
         "cooldown=60s stop=not-retryable", Outcome.UNREACHABLE, 0, shares_cooldowns=True,
         open_for_s=60.0),
    Life("a wait the tool asked for, told to the fleet",
         ("cooldown=0", "429 retry-after=1", "cooldown=0", "200"),
         "ReadCooldown Prepare Send ShareCooldown:1s WaitRetry ReadCooldown Send Settle:ok",
         "429 retry_after=1s, 200", Outcome.RECOVERED, 2, shares_cooldowns=True,
         answer="200", settled="ok"),
    Life("503, 429, validation error, repaired, 200",
         ("503", "429 retry-after=1", "422", "repair=coercion", "200"),
         "Prepare Send WaitRetry Send WaitRetry Send Repair UsePayload:coercion Send "
         "RepairJudged:coercion:succeeded Settle:ok",
         "503 backoff=0.5s, 429 retry_after=1s, 422 repair=coercion, 200", Outcome.RECOVERED,
         4, answer="200", settled="ok"),
    Life("repaired, still failing, then out of retries", ("422", "repair=coercion", "503"),
         "Prepare Send Repair UsePayload:coercion Send RepairJudged:coercion:failed "
         "Settle:failed",
         "422 repair=coercion, 503 stop=exhausted", Outcome.EXHAUSTED, 2, max_retries=1,
         answer="503", settled="failed"),
]  # fmt: skip


@pytest.mark.parametrize("life", LIVES, ids=[life.name for life in LIVES])
def test_a_request_life(life: Life) -> None:
    played = play(life)
    result = played.result
    assert " ".join(played.actions) == life.actions
    assert ", ".join(result.trail) == life.trail
    assert (result.outcome, result.attempts) == (life.outcome, life.attempts)
    answer = result.answer if isinstance(result, Relayed) else None
    assert (answer.label if answer else None) == life.answer
    assert (result.error if isinstance(result, Unanswered) else None) == life.error
    assert (result.open_for_s if isinstance(result, Paused) else None) == life.open_for_s
    assert (result.tool if isinstance(result, Paused) else "") == (
        "weather" if life.open_for_s is not None else ""
    )
    settled = [action.split(":")[1] for action in played.actions if action.startswith("Settle")]
    assert settled == ([life.settled] if life.settled else [])
    # Only the answer that goes back is held: every earlier one was let go.
    held = [handle for handle in played.handles if not handle.discarded]
    assert held == ([answer] if answer is not None else [])


def test_the_repaired_layers_behind_the_answer_are_reported() -> None:
    played = play(next(life for life in LIVES if life.name == "validation error, repaired, 200"))
    assert isinstance(played.result, Relayed)
    assert played.result.repaired == ("coercion",)


def test_each_attempt_judged_is_reported_with_its_time() -> None:
    clock = Clock()
    machine, _ = machine_for(LIVES[1], clock)
    machine.start()
    send = machine.prepared(Payload(b"{}"))
    assert isinstance(send, Send)
    clock.now += 0.25
    machine.answered(send, Handle("503", {"Retry-After": "2"}))
    [judged] = machine.outbox
    assert isinstance(judged, AttemptJudged)
    assert (judged.attempt.label, judged.elapsed_s, judged.attempt.requested_s) == ("503", 0.25, 2)


def test_a_streaming_answer_is_let_go_before_a_wait() -> None:
    clock = Clock()
    machine, _ = machine_for(LIVES[1], clock)
    assert isinstance(machine.start(), Prepare)
    send = machine.prepared(Payload(b"{}"))
    assert isinstance(send, Send)
    streaming = Handle("503", complete=False)
    assert isinstance(machine.answered(send, streaming), WaitRetry)
    assert streaming.discarded


def test_the_agent_gone_lets_the_answer_and_the_probe_go() -> None:
    clock = Clock()
    life = LIVES[1]
    machine, circuit = machine_for(life, clock)
    trip(circuit)
    clock.now += 31  # the circuit lets one probe through: this request is it
    assert isinstance(machine.start(), Prepare)
    send = machine.prepared(Payload(b"{}"))
    assert isinstance(send, Send)
    handle = Handle("503")
    machine.answered(send, handle)
    machine.agent_gone()
    assert handle.discarded
    # The probe was given back: the next request may probe.
    assert not isinstance(circuit.admit(), float)


def test_records_are_immutable_once_made() -> None:
    played = play(LIVES[1])
    with pytest.raises(AttributeError):
        played.result.outcome = Outcome.OK  # type: ignore[misc]
    clock = Clock()
    machine, _ = machine_for(LIVES[1], clock)
    machine.start()
    send = machine.prepared(Payload(b"{}"))
    assert isinstance(send, Send)
    machine.answered(send, Handle("503"))
    [attempt] = machine.records
    with pytest.raises(AttributeError):
        attempt.label = "200"  # type: ignore[misc]


def test_the_call_sent_again_on_a_new_session_is_its_first_run_not_a_retry() -> None:
    """The 404 proved the call never ran: sent again on the new session, it gets the whole
    per-try timeout, which the retry window (here ending in 0.5 s) would otherwise cut."""
    clock = Clock()
    life = Life("", (), "", "", Outcome.OK, 0, timeout_s=0.5, beyond_window_s=60.0, session=True)
    machine, _ = machine_for(life, clock)
    machine.start()
    send = machine.prepared(Payload(b"{}"))
    assert isinstance(send, Send) and send.per_try_s == 2.0
    clock.now += 0.1
    reopen = machine.answered(send, Handle("404"))
    assert isinstance(reopen, ReopenSession)
    assert reopen.time_left_s == pytest.approx(60.4)  # the deadline's, not the window's
    again = machine.reopened(True)
    assert isinstance(again, Send) and again.per_try_s == 2.0


@pytest.mark.parametrize(("beyond_window_s", "reason"), [(0.0, "deadline"), (60.0, "retry_window")])
def test_a_retry_cut_by_time_says_which_clock_cut_it(beyond_window_s: float, reason: str) -> None:
    life = Life(
        "timeout cut", ("503 +0.1s", "timeout +0.8s"), "", "", Outcome.DEADLINE, 2,
        timeout_s=1.4, beyond_window_s=beyond_window_s,
    )  # fmt: skip
    clock = Clock()
    machine, _ = machine_for(life, clock)
    machine.start()
    first = machine.prepared(Payload(b"{}"))
    assert isinstance(first, Send)
    clock.now += 0.1
    machine.answered(first, NoAnswer(AttemptError.CONNECT))
    machine.outbox.clear()
    clock.now += 0.5
    retry = machine.slept()
    assert isinstance(retry, Send)
    clock.now += retry.per_try_s
    settle = machine.answered(retry, NoAnswer(AttemptError.TIMEOUT))
    assert isinstance(settle, Settle)
    ended = machine.settled()
    assert isinstance(ended, Unanswered)
    assert (ended.outcome, ended.reason) == (Outcome.DEADLINE, reason)


# --- the protocol: each phase takes its own events, and refuses every other ------------------

# The phase table, as docs/architecture.md gives it: the events each phase takes.
PHASE_TABLE = {
    Phase.NEW: {"start", "cancelled", "agent_gone"},
    Phase.READING_COOLDOWN: {"cooldown_read", "cancelled", "agent_gone"},
    Phase.PREPARING: {"prepared", "cancelled", "agent_gone"},
    Phase.SENDING: {"answered", "hedge_due", "cancelled", "agent_gone"},
    Phase.WAITING: {"slept", "cancelled", "agent_gone"},
    Phase.COOLING_DOWN: {"slept", "cancelled", "agent_gone"},
    Phase.REPAIRING: {"repaired", "cancelled", "agent_gone"},
    Phase.REOPENING: {"reopened", "cancelled", "agent_gone"},
    Phase.SETTLING: {"settled", "cancelled", "agent_gone"},
    Phase.ENDED: {"agent_gone"},
}


def test_the_phase_table() -> None:
    assert {phase: {event.value for event in events} for phase, events in EVENTS.items()} == (
        PHASE_TABLE
    )
    # Every command the machine gives puts it in a phase, and every phase but the first is
    # reached by one.
    assert set(AWAITS) == {
        Prepare, ReadCooldown, Send, SendHedged, WaitRetry, WaitCooldown, Repair,
        ReopenSession, Settle, Relayed, Unanswered, Paused,
    }  # fmt: skip
    assert set(AWAITS.values()) == set(Phase) - {Phase.NEW}


def machine_in(phase: Phase) -> tuple[RetryMachine[Handle], Clock]:
    """A machine waiting in ``phase``, reached by the events a real life sends."""
    clock = Clock()
    cooldowns = phase in (Phase.READING_COOLDOWN, Phase.COOLING_DOWN)
    life = Life("", (), "", "", Outcome.OK, 0, shares_cooldowns=cooldowns, session=True)
    machine, _ = machine_for(life, clock)
    if phase is Phase.NEW:
        return machine, clock
    command = machine.start()
    if phase is Phase.READING_COOLDOWN:
        return machine, clock
    if phase is Phase.COOLING_DOWN:
        machine.cooldown_read(1.0)
        return machine, clock
    if isinstance(command, ReadCooldown):
        command = machine.cooldown_read(0.0)
    if phase is Phase.PREPARING:
        return machine, clock
    send = machine.prepared(Payload(b'{"lat": "35.6"}'))
    assert isinstance(send, Send)
    if phase is Phase.SENDING:
        return machine, clock
    token = {Phase.WAITING: "503", Phase.REPAIRING: "422", Phase.REOPENING: "404"}.get(phase, "200")
    answered = answer_of(token)
    assert isinstance(answered, Handle)
    command = machine.answered(send, answered)
    if phase is Phase.ENDED:
        assert isinstance(command, Settle)
        machine.settled()
    return machine, clock


def fire(machine: RetryMachine[Handle], event: MachineEvent) -> object:
    """Tell ``machine`` ``event``, with arguments it could come with."""
    if event is MachineEvent.ANSWERED:
        return machine.answered(Send(1, 1000.0, 2.0), NoAnswer(AttemptError.RESET))
    if event is MachineEvent.COOLDOWN_READ:
        return machine.cooldown_read(0.0)
    if event is MachineEvent.PREPARED:
        return machine.prepared(None)
    if event is MachineEvent.REPAIRED:
        return machine.repaired(None, None, False, 0)
    if event is MachineEvent.REOPENED:
        return machine.reopened(False)
    return getattr(machine, event.value)()


@pytest.mark.parametrize("phase", list(Phase), ids=[phase.value for phase in Phase])
def test_a_machine_waits_in_the_phase_its_command_put_it_in(phase: Phase) -> None:
    machine, _ = machine_in(phase)
    assert machine.phase is phase


def test_a_request_cancelled_before_its_engine_first_ran_ends_cancelled() -> None:
    """A task cancelled before its first step never starts the machine: its agent's cancel
    or departure is the request's end, not the sidecar's bug."""
    machine, _ = machine_in(Phase.NEW)
    result = machine.cancelled()
    assert isinstance(result, Unanswered) and result.trail == ("stop=cancelled",)
    machine, _ = machine_in(Phase.NEW)
    machine.agent_gone()
    assert machine.phase is Phase.ENDED


OUT_OF_TURN = [
    (phase, event) for phase in Phase for event in MachineEvent if event not in EVENTS[phase]
]


@pytest.mark.parametrize(
    ("phase", "event"), OUT_OF_TURN, ids=[f"{p.value}-{e.value}" for p, e in OUT_OF_TURN]
)
def test_an_event_out_of_turn_is_refused_and_changes_nothing(
    phase: Phase, event: MachineEvent
) -> None:
    machine, _ = machine_in(phase)
    trail, records = machine.trail, machine.records
    with pytest.raises(OutOfTurn) as refused:
        fire(machine, event)
    assert (refused.value.phase, refused.value.event) == (phase, event)
    assert isinstance(refused.value, SidecarBug)
    assert (machine.phase, machine.trail, machine.records) == (phase, trail, records)


@pytest.mark.parametrize("life", LIVES, ids=[life.name for life in LIVES])
def test_a_finished_life_is_freed_without_the_garbage_collector(life: Life) -> None:
    """The machine holds no reference to itself: the request's records, answers and trail go
    when the request does, not at the collector's next pass."""
    gc.disable()
    try:
        assert play(life).clock() is None
    finally:
        gc.enable()
