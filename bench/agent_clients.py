"""The MCP clients bench/agents.py runs its tasks with, each at its own defaults.

- ``agents-sdk``: the OpenAI Agents SDK's ``MCPServerStreamableHttp`` and a scripted model
  (``tests.agent_tasks.run_task``).
- ``ts-sdk``: the TypeScript SDK's ``Client`` over ``StreamableHTTPClientTransport``
  (``@modelcontextprotocol/sdk``, pinned, installed with npm into bench/.cache/ on first
  use), driven by bench/ts_client.mjs: connect, ``tools/list`` once, the task's calls, then
  ``DELETE``. One node process per cell takes the tasks one a line.
- ``pydantic-ai``: pydantic-ai's ``MCPToolset`` on the server's URL (``pydantic-ai-slim``
  with its ``mcp`` extra, on FastMCP's client) and a scripted ``FunctionModel``.

Every client makes the task's calls (tests/agent_tasks.py draws them) in a fresh MCP
session; the only setting given is the ``x-bench-task`` header that names the task for the
tap's count. A task's outcome is judged alike for all (``tests.agent_tasks.judged``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO

from tests.agent_tasks import Outcome, Task, describe, judged, run_task

CLIENTS = ("agents-sdk", "ts-sdk", "pydantic-ai")
TS_SDK = "@modelcontextprotocol/sdk"
TS_SDK_VERSION = "1.32.2"
TS_CACHE = Path(__file__).resolve().parent / ".cache" / f"ts-sdk-{TS_SDK_VERSION}"
TS_SCRIPT = Path(__file__).resolve().parent / "ts_client.mjs"


def versions(clients: list[str]) -> str:
    """The clients' packages and versions, for the report's first line."""
    named = {
        "agents-sdk": f"openai-agents {metadata.version('openai-agents')}",
        "ts-sdk": f"{TS_SDK}@{TS_SDK_VERSION} (Node {node_version()})",
        "pydantic-ai": (
            f"pydantic-ai-slim {metadata.version('pydantic-ai-slim')} "
            f"(fastmcp-slim {metadata.version('fastmcp-slim')})"
        ),
    }
    return ", ".join(named[client] for client in clients)


def node_version() -> str:
    return subprocess.run(
        ["node", "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()


def ts_sdk_dir() -> Path:
    """The pinned TypeScript SDK, installed with npm on first use."""
    installed = TS_CACHE / "node_modules" / TS_SDK
    if not (installed / "package.json").is_file():
        TS_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(TS_CACHE),
                "--no-audit",
                "--no-fund",
                "--silent",
                f"{TS_SDK}@{TS_SDK_VERSION}",
            ],
            check=True,
        )
    return installed


class TsClient:
    """bench/ts_client.mjs in one node process, started here and stopped by its PID; a task
    that outlives its bound ends the process, and the next task starts another."""

    def __init__(self, errors: Path) -> None:
        self.errors = errors
        self.process: asyncio.subprocess.Process | None = None

    async def run(self, url: str, task: Task, bound_s: float) -> Outcome:
        if self.process is None:
            with self._errors_file() as errors:
                self.process = await asyncio.create_subprocess_exec(
                    "node",
                    str(TS_SCRIPT),
                    str(ts_sdk_dir()),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=errors,
                )
        assert self.process.stdin is not None and self.process.stdout is not None
        started = time.monotonic()
        line = {
            "url": url,
            "task": task.number,
            "calls": [{"tool": c.tool, "arguments": c.arguments} for c in task.calls],
        }
        self.process.stdin.write(json.dumps(line).encode() + b"\n")
        try:
            async with asyncio.timeout(bound_s):
                await self.process.stdin.drain()
                answer = await self.process.stdout.readline()
        except TimeoutError:
            await self.stop()
            return Outcome(task, False, time.monotonic() - started, "bench bound")
        if not answer:
            await self.stop()
            return Outcome(task, False, time.monotonic() - started, "node exited")
        result = json.loads(answer)
        outputs = [str(output) for output in result["outputs"]]
        if result["error"]:
            return Outcome(task, False, result["seconds"], result["error"], outputs)
        return judged(task, outputs, result["seconds"])

    def _errors_file(self) -> BinaryIO:
        return open(self.errors, "ab")  # the caller closes it

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


def scripted_function(task: Task) -> Any:
    """A ``FunctionModel`` function that emits the task's calls one a turn, then a final
    answer, as tests/agent_tasks.py's ``ScriptedModel`` does: after as many calls as the
    messages hold answers to (a tool's return, or the retry prompt of a failed call)."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )

    def next_turn(messages: list[Any], info: Any) -> ModelResponse:
        done = sum(
            1
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart | RetryPromptPart) and part.tool_name
        )
        if done < len(task.calls):
            call = task.calls[done]
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        call.tool, dict(call.arguments), tool_call_id=f"call_{task.number}_{done}"
                    )
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    return next_turn


async def run_pydantic_ai(url: str, task: Task) -> Outcome:
    """One task in a fresh ``MCPToolset`` session (pydantic-ai's defaults throughout)."""
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelRequest, RetryPromptPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    started = time.monotonic()
    answers: dict[str, str] = {}
    try:
        toolset = MCPToolset(url, headers={"x-bench-task": str(task.number)})
        agent = Agent(FunctionModel(scripted_function(task)), toolsets=[toolset])
        async with toolset:
            result = await agent.run(f"task {task.number}")
        for message in result.all_messages():
            if not isinstance(message, ModelRequest):
                continue
            for part in message.parts:
                # A failed call comes back as a return whose outcome is "retried" (the
                # model is asked to retry: the scripted one goes on to the next call).
                failed = isinstance(part, RetryPromptPart) or (
                    isinstance(part, ToolReturnPart)
                    and getattr(part, "outcome", "success") != "success"
                )
                if isinstance(part, ToolReturnPart | RetryPromptPart) and part.tool_name:
                    text = _text(part.content)
                    answers[part.tool_call_id] = f"error: {text}" if failed else text
    except Exception as error:  # a failed task is a result, whatever the client raised
        return Outcome(task, False, time.monotonic() - started, describe(error))
    outputs = [
        answers[f"call_{task.number}_{n}"]
        for n in range(len(task.calls))
        if f"call_{task.number}_{n}" in answers
    ]
    return judged(task, outputs, time.monotonic() - started)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(item, str) for item in content):
        return "\n".join(content)
    return str(content)


class Clients:
    """Runs one task with the named client; ``close`` stops what it started."""

    def __init__(self, client: str, workdir: Path) -> None:
        self.client = client
        self.ts = TsClient(workdir / "ts-client.err") if client == "ts-sdk" else None

    async def run(self, url: str, task: Task, bound_s: float) -> Outcome:
        if self.ts is not None:
            return await self.ts.run(url, task, bound_s)
        runner = run_pydantic_ai if self.client == "pydantic-ai" else run_task
        try:
            async with asyncio.timeout(bound_s):
                return await runner(url, task)
        except TimeoutError:
            return Outcome(task, False, bound_s, "bench bound")

    async def close(self) -> None:
        if self.ts is not None:
            await self.ts.stop()
