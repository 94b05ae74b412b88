"""The retry loop: the I/O a request's retry machine asks for, until it ends.

Every rule lives in ``machine`` (and the pure functions it calls); this module carries out
its commands — send (hedged when it says so), sleep, prepare the payload, read the fleet's
cooldowns, ask the repair layers, open an MCP session again, count the verdict in the
circuit — tells it how each ended, and carries out the reports it leaves in its outbox
(telemetry through ``Hooks``, a payload to use, a cooldown to share). It never invents an
answer: the machine's result holds the tool's last real one, or — only when none exists —
what the sidecar says instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sidecar.config import RouteConfig
from sidecar.repair.payload import Payload
from sidecar.repair.pipeline import RepairJob, Repairs
from sidecar.retry import steps
from sidecar.retry.call import carrying, describe, terms_of
from sidecar.retry.cancel import unless_stopped
from sidecar.retry.controls import RequestControls
from sidecar.retry.guards.fleet import StateStore
from sidecar.retry.guards.route import RouteGuards
from sidecar.retry.hedge import Hedging, Sent
from sidecar.retry.machine import RetryMachine
from sidecar.telemetry import Hooks
from sidecar.transport.exchange import (
    Answer,
    UpstreamRequest,
    read_for_decision,
    resume,
    send,
)
from sidecar.transport.pool import Pool, Response

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
Command = steps.Command[Answer]
# How one command is carried out: the machine's next command when it is done.
Handler = Callable[["_Run", Any], Awaitable[Command]]
# How one report is carried out.
Reporter = Callable[["_Run", Any], Awaitable[None]]


class Engine:
    """What every request shares: the upstream pool, each route's guards, the repairs."""

    def __init__(
        self,
        pool: Pool,
        hooks: Hooks,
        routes: Sequence[RouteConfig],
        repairs: Repairs,
        *,
        inspect_limit: int,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        state: StateStore | None = None,
    ) -> None:
        self.pool = pool
        self.hooks = hooks
        self.repairs = repairs
        self.inspect_limit = inspect_limit
        self.sleep = sleep
        self.clock = clock
        self.wall = wall
        self.guards = {route.name: RouteGuards.for_route(route, clock, state) for route in routes}
        self.hedging = Hedging(pool, hooks, clock)

    async def run(
        self,
        route: RouteConfig,
        request: UpstreamRequest,
        controls: RequestControls,
        payload: Payload | None,
        stop: asyncio.Event | None = None,
    ) -> steps.Result[Answer]:
        """Send ``request`` until an answer can go back, or the agent cancels it (``stop``).

        ``payload`` is the buffered body, which may be replayed and repaired; ``None`` means
        the body streams through and the request is tried once.
        """
        run = _Run(self, route, request, controls, payload)
        try:
            ended = await unless_stopped(run.drive(), stop)
            if ended is None:  # the agent cancelled it: no verdict on the tool
                return run.machine.cancelled()
            if isinstance(ended, steps.Settle):
                await run.settle(ended)
                return run.machine.settled()
            return ended
        except BaseException:
            # The agent went away during an attempt, a repair, a wait or the verdict's
            # count, or the sidecar failed: the answer held and the circuit's admission go.
            run.machine.agent_gone()
            raise


class _Run:
    """One request's I/O: the request as it goes upstream, and its machine."""

    def __init__(
        self,
        engine: Engine,
        route: RouteConfig,
        request: UpstreamRequest,
        controls: RequestControls,
        payload: Payload | None,
    ) -> None:
        self.engine = engine
        self.hooks = engine.hooks
        self.route = route.name
        self.tuning = route.tuning
        self.controls = controls
        guards = engine.guards[route.name]
        call = describe(route, request, payload, guards, engine.repairs.path_template)
        self.path, self.own_key = call.path, call.own_key
        self.sessions, self.session = guards.sessions, call.session
        self.request, self.payload = call.request, payload
        terms, self.tool_guards = terms_of(route, controls, call, guards, engine.clock())
        self.tool = terms.tool
        self.machine: RetryMachine[Answer] = RetryMachine(
            terms,
            circuit=self.tool_guards.circuit,
            budget=guards.budget,
            clock=engine.clock,
            wall=engine.wall,
            tools=guards.mcp_tools if call.lists_tools else None,
        )

    async def prepare(self, _: steps.Prepare) -> Command:
        """Coerce the agent's payload before the first attempt; put the idempotency key on."""
        payload = self.payload
        if payload is not None:
            payload = self.engine.repairs.prepare(
                self.route, self.request.method, self.path, payload, self.controls.repair
            )
            if payload.layers:
                self.hooks.repair_result(self.route, "coercion", "applied")
        self.request = carrying(self.request, payload, self.own_key)
        return self.machine.prepared(payload)

    async def drive(self) -> steps.Settle | steps.Result[Answer]:
        """The machine's commands, carried out, each after the reports before it, until it
        settles or ends the request."""
        machine = self.machine
        outbox = machine.outbox
        command = machine.start()
        self.hooks.circuit_state(self.route, self.tool_guards.circuit.state, self.tool)
        while True:
            if outbox:
                reports = outbox.copy()
                outbox.clear()
                for report in reports:
                    await _REPORTERS[type(report)](self, report)
            if isinstance(command, _ENDS):
                return command
            command = await _HANDLERS[type(command)](self, command)

    async def settle(self, settle: steps.Settle) -> None:
        """The request's verdict into the circuit (the fleet's window, when it shares one)."""
        window_s = self.tuning.circuit_window_ms / 1000
        await self.tool_guards.record(self.machine.ticket, settle.failed, window_s)
        self.hooks.circuit_state(self.route, self.tool_guards.circuit.state, self.tool)

    async def send(self, copy: steps.Send) -> Command:
        request = self._request_of(copy)
        return await self._answered(copy, await send(self.engine.pool, request, copy.per_try_s))

    async def send_hedged(self, hedged: steps.SendHedged) -> Command:
        hedging, machine = self.engine.hedging, self.machine
        copy, sent = await hedging.send(self.route, self._request_of, hedged, machine.hedge_due)
        return await self._answered(copy, sent)

    def _request_of(self, copy: steps.Send) -> UpstreamRequest:
        """The request ``copy`` sends: with its trace context, when it is traced."""
        request = self.request
        trace = self.hooks.attempt_started(copy.number, hedge=copy.hedge)
        if not trace:
            return request
        headers = request.headers.copy()
        for name, value in trace.items():
            headers[name] = value
        return request.with_headers(headers)

    async def _answered(self, copy: steps.Send, sent: Sent) -> Command:
        """Read what a decision needs of the answer that came first, for the machine."""
        limit, inspect_s = self.engine.inspect_limit, self.tuning.inspect_timeout_ms / 1000
        result = (
            await read_for_decision(self.request, sent, limit, inspect_s)
            if isinstance(sent, Response)
            else sent
        )
        if isinstance(result, Answer) and result.broken and self.request.rpc_id is not None:
            # An MCP call's stream is resumed before anything is replayed: the server holds
            # what follows.
            per_try_s = min(self.tuning.per_try_timeout_ms / 1000, self.machine.time_left_s())
            timeouts = (per_try_s, inspect_s)
            result = await resume(self.engine.pool, self.request, result, limit, timeouts)
        return self.machine.answered(copy, result)

    async def wait_retry(self, wait: steps.WaitRetry) -> Command:
        self.hooks.retry_scheduled(
            self.route, wait.attempts, wait.label, wait.reason, wait.wait, wait.failure
        )
        await self.engine.sleep(wait.wait.seconds)
        return self.machine.slept()

    async def wait_cooldown(self, wait: steps.WaitCooldown) -> Command:
        await self.engine.sleep(wait.seconds)
        return self.machine.slept()

    async def read_cooldown(self, _: steps.ReadCooldown) -> Command:
        fleet = self.tool_guards.fleet
        assert fleet is not None
        return self.machine.cooldown_read(await fleet.cooldown_s(self.path))

    async def repair(self, ask: steps.Repair) -> Command:
        self.hooks.repair_started(self.route)
        proposal = await self.engine.repairs.propose(
            RepairJob(
                route=self.route,
                request=self.request,
                path=self.path,
                payload=ask.payload,
                reply=ask.reply,
                attempt=ask.attempts,
                level=self.controls.repair,
                intent=self.controls.intent,
                tried=ask.tried,
                llm_repairs_left=ask.llm_repairs_left,
                time_left_s=ask.time_left_s,
            )
        )
        self.hooks.repair_finished(self.route, proposal.layer)
        return self.machine.repaired(
            proposal.payload, proposal.layer, proposal.retry_same, proposal.llm_repairs
        )

    async def reopen_session(self, reopen: steps.ReopenSession) -> Command:
        """Open the request's MCP session again, within the request's deadline; the
        request names the new one from now on."""
        assert self.session is not None
        per_try_s, pool = self.tuning.per_try_timeout_ms / 1000, self.engine.pool
        # A reopening the deadline cuts counts as one that failed, if this request was
        # opening it rather than waiting for another's.
        request, opened_here = None, not self.sessions.opening(self.session)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(reopen.time_left_s):
                request, opened_here = await self.sessions.reopen(
                    pool, self.request, self.session, self.engine.inspect_limit, per_try_s
                )
        if request is not None:
            self.request = request
        if opened_here:  # once per session opened again, however many requests it carries
            self.hooks.session_reopened(self.route, request is not None)
        return self.machine.reopened(request is not None)

    # Reports.

    async def attempt_judged(self, judged: steps.AttemptJudged) -> None:
        attempt, reply = judged.attempt, judged.attempt.reply
        failure = reply.failure if reply is not None else None
        number = attempt.copy.number
        self.hooks.attempt_finished(self.route, number, attempt.label, judged.elapsed_s, failure)

    async def use_payload(self, use: steps.UsePayload) -> None:
        self.hooks.repaired_retry(self.route, use.attempts, use.label, use.layer)
        self.request = carrying(self.request, use.payload, self.own_key)

    async def repair_judged(self, judged: steps.RepairJudged) -> None:
        self.hooks.repair_result(self.route, judged.layer, judged.result)

    async def share_cooldown(self, share: steps.ShareCooldown) -> None:
        fleet = self.tool_guards.fleet
        assert fleet is not None
        await fleet.publish_cooldown(share.seconds, share.path)

    async def budget_exhausted(self, _: steps.ReportBudgetExhausted) -> None:
        self.hooks.budget_exhausted(self.route)

    async def circuit_refused(self, _: steps.ReportCircuitRefused) -> None:
        self.hooks.circuit_refused(self.route, self.tool)


# The commands that end the loop: the verdict to count, or the request's result.
_ENDS = (steps.Settle, steps.Relayed, steps.Unanswered, steps.Paused)
# Each command's type to the step that carries it out: one lookup, however many kinds.
_HANDLERS: dict[type, Handler] = {
    steps.Send: _Run.send,
    steps.SendHedged: _Run.send_hedged,
    steps.WaitRetry: _Run.wait_retry,
    steps.Prepare: _Run.prepare,
    steps.WaitCooldown: _Run.wait_cooldown,
    steps.ReadCooldown: _Run.read_cooldown,
    steps.Repair: _Run.repair,
    steps.ReopenSession: _Run.reopen_session,
}
_REPORTERS: dict[type, Reporter] = {
    steps.AttemptJudged: _Run.attempt_judged,
    steps.UsePayload: _Run.use_payload,
    steps.RepairJudged: _Run.repair_judged,
    steps.ShareCooldown: _Run.share_cooldown,
    steps.ReportBudgetExhausted: _Run.budget_exhausted,
    steps.ReportCircuitRefused: _Run.circuit_refused,
}
