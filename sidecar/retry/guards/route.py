"""What a route remembers across requests: its budget, circuit, backoff and learned hints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config import RouteConfig
from sidecar.retry.guards.budget import RetryBudget
from sidecar.retry.guards.circuit import CircuitBreaker, CircuitState, Ticket
from sidecar.retry.guards.fleet import RouteState
from sidecar.retry.policy import Backoff
from sidecar.retry.replay import McpToolHints

Clock = Callable[[], float]


@dataclass(slots=True)
class RouteGuards:
    """What a route remembers across requests."""

    budget: RetryBudget
    circuit: CircuitBreaker
    backoff: Backoff
    mcp_tools: McpToolHints
    fleet: RouteState | None = None  # what the route shares with its replicas, when it does

    @classmethod
    def for_route(
        cls, route: RouteConfig, clock: Clock, fleet: RouteState | None = None
    ) -> RouteGuards:
        tuning = route.tuning
        return cls(
            budget=RetryBudget(tuning.retry_budget_ratio, tuning.retry_budget_min_per_s, clock),
            circuit=CircuitBreaker(
                min_failures=tuning.circuit_failures,
                failure_rate=tuning.circuit_failure_rate,
                window_s=tuning.circuit_window_ms / 1000,
                open_s=tuning.circuit_open_ms / 1000,
                probes=tuning.circuit_half_open_probes,
                clock=clock,
            ),
            backoff=Backoff(
                base_s=tuning.backoff_base_ms / 1000,
                cap_s=tuning.backoff_max_ms / 1000,
                multiplier=tuning.backoff_multiplier,
                jitter=tuning.backoff_jitter,
            ),
            mcp_tools=McpToolHints(),
            fleet=fleet,
        )

    async def record(self, ticket: Ticket, failed: bool, window_s: float) -> None:
        """A request's verdict into the circuit: the fleet's window when the route shares
        one (the process's own when the store cannot answer); an opening circuit is
        published as a cooldown."""
        circuit, fleet = self.circuit, self.fleet
        totals = None
        if fleet is not None and circuit.counts(ticket):
            totals = await fleet.count(failed, window_s)
        was_open = circuit.state is CircuitState.OPEN
        circuit.record(ticket, failed, totals)
        if fleet is not None and circuit.state is CircuitState.OPEN and not was_open:
            await fleet.publish_open(circuit.open_for_s(), window_s)
