"""A real agent's loop over MCP through the sidecar: bench/agents.py's matrix, one cell, small.

The OpenAI Agents SDK (``MCPServerStreamableHttp`` at its defaults, a scripted model) makes
8 tasks, each a fresh MCP session with 1–3 tool calls, through ``tool-retry-sidecar serve``
(a real process, shipped defaults) to the Python MCP SDK's server with an event store, whose
event streams open with a priming event as server-everything's do (tests/agent_tasks.py).
Between the sidecar and the server, the counting tap (tests/mcp_tap.py) answers the first
attempt of every third call of a read-only tool (``echo``, ``get-sum``) itself, without
delivering it, with a 200 event stream holding JSON-RPC ``-32603`` and ``data.retryable:
true`` after a priming event: the profile where the sidecar did worse than no proxy. The
faults fall on the same calls whatever is retried, so every run meets the same ones; a call
of the non-idempotent ``toggle-simulated-logging`` meets none (no proxy may repeat it after
the tool's answer), and the tap counts that the sidecar repeated none.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

# The Agents SDK needs openai>=3, above the package's own floor (openai>=1.40): .ci/run's
# run on the lowest versions installs the `test` extra, which leaves it out, and skips here.
pytest.importorskip("agents", reason="the OpenAI Agents SDK is in the dev extra only")

from tests.agent_tasks import NOT_IDEMPOTENT, Outcome, everything_app, run_task, tasks
from tests.asgi import uvicorn_serving
from tests.mcp_tap import Tally, Tap, first_attempts, tap_serving
from tests.processes import sidecar_process

pytestmark = pytest.mark.fault

TASKS = tasks(8, seed=1)
EVERY_NTH_CALL = 3
READ_ONLY_TOOLS = frozenset({"echo", "get-sum"})


@pytest.fixture(autouse=True)
def quiet_sdks() -> Iterator[None]:
    """The SDKs log every request and failed tool call; the assertions say what matters."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


async def run_cell() -> tuple[list[Outcome], Tally]:
    tap = Tap("", fault="rpc-error", decide=first_attempts(EVERY_NTH_CALL, READ_ONLY_TOOLS))
    async with uvicorn_serving(everything_app()) as tool:
        tap.upstream = tool
        async with tap_serving(tap) as tapped, sidecar_process(tapped) as sidecar:
            outcomes = [await run_task(f"{sidecar.proxy}/mcp", task) for task in TASKS]
    return outcomes, tap.tally


def test_the_task_set_has_every_tool_and_faults_fall_on_calls() -> None:
    called = [call.tool for task in TASKS for call in task.calls]
    assert set(called) == {"echo", "get-sum", "toggle-simulated-logging"}
    read_only = [tool for tool in called if tool in READ_ONLY_TOOLS]
    assert len(read_only) >= 2 * EVERY_NTH_CALL  # at least two calls meet a fault


async def test_no_call_the_tool_ran_is_run_again() -> None:
    outcomes, tally = await run_cell()
    assert tally.faults["rpc-error"] >= 2
    # Every fault came before delivery: a call the server received twice was repeated by
    # the path, and the toggle would have answered "Stopped…".
    assert tally.calls_run_twice() == []
    toggles = [d.task for d in tally.deliveries if d.tool in NOT_IDEMPOTENT]
    assert toggles and len(toggles) == len(set(toggles))
    # Every task reached the tool: the tap's answers were the only faults.
    assert {d.task for d in tally.deliveries} == {str(task.number) for task in TASKS}
    assert len(outcomes) == len(TASKS)


async def test_every_task_succeeds_when_the_tool_says_retry() -> None:
    outcomes, tally = await run_cell()
    assert tally.faults["rpc-error"] >= 2
    failed = [(o.task.number, o.error) for o in outcomes if not o.succeeded]
    assert failed == []
