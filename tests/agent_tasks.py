"""Agent tasks over MCP: the OpenAI Agents SDK, a scripted model, tools nobody here wrote.

Each task is a fresh ``MCPServerStreamableHttp`` session at the SDK's defaults (its 5 s
timeout included) driven by a model that emits the task's 1–3 tool calls, one a turn, then
a final answer: no LLM, so only the path between agent and tool varies. The tools are those
of the reference server ``@modelcontextprotocol/server-everything``: ``echo`` and ``get-sum``
(read-only, idempotent) and ``toggle-simulated-logging`` (neither: its first call in a
session answers "Started…", a second "Stopped…"). ``everything_server`` is the same three on
the Python MCP SDK, with an event store, so that its streams open with a priming event as
the reference server's do.

A task succeeded when the run finished and every tool answer is the right one; a toggle run
twice answers "Stopped…" and fails its task. Task *n* draws its calls from its own seed
(``seed`` + *n*); the tasks with an even *n* are one half of the set, the odd ones the other,
so that settings tuned on the even half can be judged on the odd one, held out.
bench/agent_clients.py runs the same tasks with the TypeScript SDK's client and pydantic-ai's,
judged by ``judged`` alike.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from agents import Agent, ModelResponse, RunConfig, Runner, Usage
from agents.items import ToolCallOutputItem, TResponseInputItem
from agents.mcp import MCPServerStreamableHttp
from agents.models.interface import Model
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import JSONRPCMessage, ToolAnnotations
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from tests.asgi import read_body, replaying

TOOLS = ("echo", "get-sum", "toggle-simulated-logging")
NOT_IDEMPOTENT = frozenset({"toggle-simulated-logging"})


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]

    def expects(self, output: str) -> bool:
        if self.tool == "echo":
            return output == f"Echo: {self.arguments['message']}"
        if self.tool == "get-sum":
            a, b = self.arguments["a"], self.arguments["b"]
            return output == f"The sum of {a} and {b} is {a + b}."
        return output.startswith("Started")


@dataclass(frozen=True)
class Task:
    number: int
    calls: tuple[Call, ...]

    @property
    def half(self) -> str:
        return "even" if self.number % 2 == 0 else "odd"


def tasks(count: int, seed: int) -> list[Task]:
    return [_task(number, random.Random(seed + number)) for number in range(count)]


def _task(number: int, draws: random.Random) -> Task:
    calls: list[Call] = []
    for index in range(draws.randint(1, 3)):
        tool = draws.choice(TOOLS)
        if tool == "toggle-simulated-logging" and any(c.tool == tool for c in calls):
            tool = "echo"  # a second toggle in one session answers "Stopped…" by design
        if tool == "echo":
            calls.append(Call(tool, {"message": f"task {number} call {index}"}))
        elif tool == "get-sum":
            calls.append(Call(tool, {"a": draws.randint(1, 999), "b": draws.randint(1, 999)}))
        else:
            calls.append(Call(tool, {}))
    return Task(number, tuple(calls))


class ScriptedModel(Model):
    """Emits the task's calls one a turn, then a final answer; never calls an LLM."""

    def __init__(self, task: Task) -> None:
        self.task = task

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        """The next call, after as many calls as the input holds answers to."""
        done = sum(
            1
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        )
        if done < len(self.task.calls):
            call = self.task.calls[done]
            output: Any = ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{self.task.number}_{done}",
                call_id=f"call_{self.task.number}_{done}",
                name=call.tool,
                arguments=orjson.dumps(call.arguments).decode(),
                status="completed",
            )
        else:
            output = ResponseOutputMessage(
                type="message",
                id=f"msg_{self.task.number}",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
            )
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tasks run without streaming")


@dataclass
class Outcome:
    task: Task
    succeeded: bool
    seconds: float
    error: str = ""  # what went wrong, when the task did not succeed
    outputs: list[str] = field(default_factory=list)


async def run_task(url: str, task: Task) -> Outcome:
    """One task in a fresh MCP session on ``url`` (the SDK's defaults throughout)."""
    started = time.monotonic()
    outputs: list[str] = []
    try:
        # The header only names the task for the tap's count; every setting is the SDK's.
        params = {"url": url, "headers": {"x-bench-task": str(task.number)}}
        async with MCPServerStreamableHttp(params, name="everything") as server:
            agent = Agent(name="bench", model=ScriptedModel(task), mcp_servers=[server])
            result = await Runner.run(
                agent,
                f"task {task.number}",
                max_turns=8,
                run_config=RunConfig(tracing_disabled=True),
            )
            outputs = [
                _text(item.output)
                for item in result.new_items
                if isinstance(item, ToolCallOutputItem)
            ]
    except Exception as error:  # a failed task is a result, whatever the SDK raised
        return Outcome(task, False, time.monotonic() - started, describe(error), outputs)
    return judged(task, outputs, time.monotonic() - started)


def judged(task: Task, outputs: list[str], seconds: float) -> Outcome:
    """The outcome of a task that ran to its end: it succeeded when every tool answer is
    the right one (whatever client made the calls)."""
    wrong = [
        output
        for call, output in zip(task.calls, outputs, strict=False)
        if not call.expects(output)
    ]
    if len(outputs) != len(task.calls) or wrong:
        return Outcome(task, False, seconds, f"tool answered {wrong or outputs}"[:300], outputs)
    return Outcome(task, True, seconds, "", outputs)


def _text(output: Any) -> str:
    if isinstance(output, dict) and output.get("type") == "text":
        return str(output.get("text"))
    return str(output)


def describe(error: BaseException) -> str:
    """An exception (or every exception of a group) as one line."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}"[:300]


class MemoryEventStore(EventStore):
    """Every event kept in memory, replayable after its id: what makes a server prime."""

    def __init__(self) -> None:
        self.events: list[tuple[EventId, StreamId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        ids = [event_id for event_id, _, _ in self.events]
        if last_event_id not in ids:
            return None
        stream = self.events[ids.index(last_event_id)][1]
        for event_id, stream_id, message in self.events[ids.index(last_event_id) + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False)
TOGGLES = ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=False)


def everything_server() -> MCPServer:
    """server-everything's ``echo``, ``get-sum`` and ``toggle-simulated-logging``, as it
    annotates and answers them, on the Python MCP SDK."""
    server = MCPServer("everything")
    logging_on: set[int] = set()

    @server.tool(name="echo", annotations=READ_ONLY)
    async def echo(message: str) -> str:
        return f"Echo: {message}"

    @server.tool(name="get-sum", annotations=READ_ONLY)
    async def get_sum(a: float, b: float) -> str:
        return f"The sum of {_number(a)} and {_number(b)} is {_number(a + b)}."

    @server.tool(name="toggle-simulated-logging", annotations=TOGGLES)
    async def toggle(ctx: Context) -> str:
        session = id(ctx.session)
        if session in logging_on:
            logging_on.discard(session)
            return "Stopped simulated logging"
        logging_on.add(session)
        return "Started simulated logging"

    return server


class DiscoverRefused:
    """An ASGI gate that answers ``server/discover`` as server-everything 2026.8.31 does
    (HTTP 400, "Server not initialized"), so that clients fall back to the 2025-11-25
    handshake and sessions, as they do against it; everything else goes to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the caller went away
        if _method(body) == "server/discover":
            refusal = orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "error": {"code": -32000, "message": "Bad Request: Server not initialized"},
                    "id": None,
                }
            )
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": refusal})
            return
        await self.app(scope, replaying(body, receive), send)


def everything_app() -> Any:
    """The Python server above as server-everything serves its tools: streamable HTTP on
    ``/mcp``, an event store (streams open with a priming event), no ``server/discover``."""
    app = everything_server().streamable_http_app(event_store=MemoryEventStore())
    return DiscoverRefused(app)


def _method(body: bytes) -> object:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return message.get("method") if isinstance(message, dict) else None


def _number(value: float) -> str:
    """As JavaScript prints a number: 3, not 3.0."""
    return str(int(value)) if value == int(value) else str(value)
