"""What a route remembers across requests: its budget, backoff, learned hints, the MCP
sessions it relayed the opening of, and the guards of each of its tools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.config import RouteConfig
from sidecar.retry.guards.budget import RetryBudget
from sidecar.retry.guards.circuit import CircuitBreaker
from sidecar.retry.guards.fleet import StateStore
from sidecar.retry.guards.tools import MAX_TOOLS_PER_ROUTE, OVERFLOW_TOOL, ToolGuards
from sidecar.retry.policy import Backoff
from sidecar.retry.replay import McpToolHints
from sidecar.retry.sessions import McpSessions

Clock = Callable[[], float]


@dataclass(slots=True)
class RouteGuards:
    """What a route remembers across requests."""

    route: RouteConfig
    budget: RetryBudget
    backoff: Backoff
    mcp_tools: McpToolHints
    clock: Clock
    sessions: McpSessions
    store: StateStore | None = None  # the fleet's store, when the route shares its state
    tools: dict[str, ToolGuards] = field(default_factory=dict)

    @classmethod
    def for_route(
        cls, route: RouteConfig, clock: Clock, store: StateStore | None = None
    ) -> RouteGuards:
        tuning = route.tuning
        store = store if route.shared_state else None
        return cls(
            route=route,
            budget=RetryBudget(tuning.retry_budget_ratio, tuning.retry_budget_min_per_s, clock),
            backoff=Backoff(
                base_s=tuning.backoff_base_ms / 1000,
                cap_s=tuning.backoff_max_ms / 1000,
                multiplier=tuning.backoff_multiplier,
                jitter=tuning.backoff_jitter,
            ),
            mcp_tools=McpToolHints(),
            clock=clock,
            sessions=McpSessions(store.for_route(route) if store else None, clock),
            store=store,
        )

    def tool(self, name: str) -> tuple[str, ToolGuards]:
        """The guards of tool ``name``, made on its first call; past the cap, the overflow
        tool's (its name is returned with them)."""
        guards = self.tools.get(name)
        if guards is not None:
            return name, guards
        if len(self.tools) >= MAX_TOOLS_PER_ROUTE:
            name = OVERFLOW_TOOL
            guards = self.tools.get(name)
            if guards is not None:
                return name, guards
        tuning = self.route.tuning
        guards = self.tools[name] = ToolGuards(
            CircuitBreaker(
                min_failures=tuning.circuit_failures,
                min_calls=tuning.circuit_min_calls,
                failure_rate=tuning.circuit_failure_rate,
                window_s=tuning.circuit_window_ms / 1000,
                open_s=tuning.circuit_open_ms / 1000,
                probes=tuning.circuit_half_open_probes,
                clock=self.clock,
            ),
            self.store.for_tool(self.route, name) if self.store is not None else None,
        )
        return name, guards
