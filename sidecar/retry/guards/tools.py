"""One circuit per tool: which tool a call is for, and what each tool's guards remember.

Behind one route sit many tools — a REST server's endpoints, every tool of an MCP server
on its one path. With the ``tool`` circuit scope each has its own circuit and cooldowns,
so one failing tool costs its own calls and nothing else; the retry budget stays the
route's, since it bounds what the route's traffic may add.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.config.values import CircuitScope
from sidecar.credentials import mask_path
from sidecar.retry.guards.circuit import CircuitBreaker, CircuitState, Ticket
from sidecar.retry.guards.fleet import RouteState
from sidecar.retry.replay import Rpc

# The circuits one route keeps at most: without a schema a tool is named by its path, and
# paths come from agents. Past the cap every new one shares the overflow tool's guards.
MAX_TOOLS_PER_ROUTE = 100
OVERFLOW_TOOL = "_other"
# The one tool of a route whose scope is ``route``.
WHOLE_ROUTE = ""


def tool_of(
    scope: CircuitScope,
    path: str,
    template: str | None = None,
    rpc: Rpc | None = None,
) -> str:
    """The tool a call is for: an MCP ``tools/call``'s tool name, else the OpenAPI path
    template it matched, else its path (without the query); one tool per route in the
    ``route`` scope. The name is a metric label and a log field: credentials an agent put
    in its path (``;access_token=…``) are masked here, once, for all of them."""
    if scope == "route":
        return WHOLE_ROUTE
    if rpc is not None and rpc[0] == "tools/call" and rpc[1]:
        return mask_path(rpc[1])
    return template or mask_path(path)


@dataclass(slots=True)
class ToolGuards:
    """What one tool's calls remember: its circuit, and its keys in the fleet store."""

    circuit: CircuitBreaker
    fleet: RouteState | None = None  # what the tool shares with the replicas, when it does

    async def record(self, ticket: Ticket, failed: bool, window_s: float) -> None:
        """A request's verdict into the circuit: the fleet's window when the tool shares
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
