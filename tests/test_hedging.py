"""Hedged calls: a slow call that is safe to run twice gets one more copy; the first
answer head wins and the other copy's connection is closed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from sidecar.retry.hedge import Raced, race

HEDGE = {"hedge_after_ms": 50, "max_retries": 0}


class SlowFirstCall:
    """A tool whose first call answers only after ``first_after_s`` (never, by default);
    every later call answers at once. It notes when the first call's client went away."""

    def __init__(self, first_after_s: float | None = None) -> None:
        self.first_after_s = first_after_s
        self.calls = 0
        self.first_dropped = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        copy = self.calls
        if copy == 1:
            try:
                if self.first_after_s is None:
                    await asyncio.Event().wait()
                await asyncio.sleep(self.first_after_s)
            except asyncio.CancelledError:
                self.first_dropped.set()
                raise
        return web.json_response({"copy": copy})


async def hedged_tool(make_tool, first_after_s: float | None = None) -> tuple[Any, SlowFirstCall]:
    slow = SlowFirstCall(first_after_s)
    # The test server cancels a handler whose client went away: so the tool sees a copy
    # dropped.
    return await make_tool(slow.handle), slow


SAFE_CALLS = {
    "GET": ("GET", {}, {}),
    "POST with the agent's Idempotency-Key": ("POST", {"Idempotency-Key": "order-7"}, {}),
    "POST on an idempotent route": ("POST", {}, {"idempotent": True}),
}


@pytest.mark.parametrize("method, headers, route_keys", SAFE_CALLS.values(), ids=SAFE_CALLS)
async def test_a_slow_call_safe_to_repeat_gets_one_copy_and_the_first_answer_wins(
    make_tool, make_sidecar, method, headers, route_keys
):
    tool, slow = await hedged_tool(make_tool)
    routes = [{"name": "search", "prefix": "/", "upstream": tool.url, **route_keys}]
    sidecar = await make_sidecar(None, routes=routes, **HEDGE)

    answer = await sidecar.client.request(method, "/search?q=1", json={"q": 1}, headers=headers)

    assert answer.status == 200
    assert await answer.json() == {"copy": 2}
    assert answer.headers["X-Sidecar-Trail"] == "hedge=0.05s, 200"
    assert answer.headers["X-Sidecar-Attempts"] == "2"
    assert answer.headers["X-Sidecar-Outcome"] == "ok"
    await asyncio.wait_for(slow.first_dropped.wait(), timeout=5)
    assert [seen.body for seen in tool.seen] == [b'{"q": 1}'] * 2

    def metric(name: str, **labels: str) -> float:
        return sidecar.metric(name, route="search", **labels)

    assert metric("sidecar_hedges_total", result="won") == 1
    assert metric("sidecar_upstream_attempts_total", status="cancelled") == 1
    assert metric("sidecar_upstream_attempts_total", status="200") == 1


NOT_SAFE = {
    "POST without a key": {},
    "POST without a key, replay_delivered always": {"replay_delivered": "always"},
}


@pytest.mark.parametrize("settings", NOT_SAFE.values(), ids=NOT_SAFE)
async def test_a_call_not_safe_to_repeat_is_never_hedged(make_tool, make_sidecar, settings):
    # The first call answers well after the hedge would have gone: the copy would be first.
    tool, slow = await hedged_tool(make_tool, first_after_s=0.3)
    sidecar = await make_sidecar(tool, **HEDGE, **settings)

    answer = await sidecar.client.post("/orders", json={"item": "book"})

    assert await answer.json() == {"copy": 1}
    assert answer.headers["X-Sidecar-Trail"] == "200"
    assert slow.calls == 1
    assert sidecar.label_values("result") & {"won", "lost", "unanswered"} == set()


async def test_a_hedge_is_paid_from_the_retry_budget_or_not_sent(make_tool, make_sidecar):
    tool, slow = await hedged_tool(make_tool, first_after_s=0.3)
    sidecar = await make_sidecar(tool, retry_budget_ratio=0, retry_budget_min_per_s=0, **HEDGE)

    answer = await sidecar.client.get("/search")

    assert await answer.json() == {"copy": 1}
    assert answer.headers["X-Sidecar-Trail"] == "200"
    assert slow.calls == 1


async def test_the_first_answer_wins_even_when_it_is_the_original(make_tool, make_sidecar):
    release_first = asyncio.Event()
    calls = 0

    async def second_hangs(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release_first.wait()
            return web.json_response({"copy": 1})
        release_first.set()  # the copy has arrived: now the original answers
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    tool = await make_tool(second_hangs)
    sidecar = await make_sidecar(tool, **HEDGE)

    answer = await sidecar.client.get("/search")

    assert await answer.json() == {"copy": 1}
    assert answer.headers["X-Sidecar-Trail"] == "hedge=0.05s, 200"
    assert sidecar.metric("sidecar_hedges_total", route="default", result="lost") == 1


def tools_list(*tools: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"tools": list(tools)}}


async def test_an_mcp_call_is_hedged_only_for_a_tool_annotated_read_only(make_tool, make_sidecar):
    slow_calls: dict[str, int] = {}

    async def mcp(request: web.Request) -> web.Response:
        call = await request.json()
        if call["method"] == "tools/list":
            return web.json_response(
                tools_list(
                    {"name": "lookup", "annotations": {"readOnlyHint": True}},
                    {"name": "send_email", "annotations": {"readOnlyHint": False}},
                )
            )
        name = call["params"]["name"]
        slow_calls[name] = slow_calls.get(name, 0) + 1
        if slow_calls[name] == 1:
            await asyncio.sleep(0.3)
        result = {"content": [{"type": "text", "text": str(slow_calls[name])}]}
        return web.json_response({"jsonrpc": "2.0", "id": call["id"], "result": result})

    tool = await make_tool(mcp)
    sidecar = await make_sidecar(tool, **HEDGE)
    listed = await sidecar.client.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert listed.status == 200

    def call(name: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name}}

    read = await sidecar.client.post("/mcp", json=call("lookup"))
    write = await sidecar.client.post("/mcp", json=call("send_email"))

    assert read.headers["X-Sidecar-Trail"] == "hedge=0.05s, 200"
    assert (await read.json())["result"]["content"][0]["text"] == "2"
    assert write.headers["X-Sidecar-Trail"] == "200"
    assert (await write.json())["result"]["content"][0]["text"] == "1"
    names = [json.loads(seen.body).get("params", {}).get("name") for seen in tool.seen[1:]]
    assert names == ["lookup", "lookup", "send_email"]


async def test_when_neither_copy_answers_the_last_to_end_is_returned_and_the_other_dropped():
    hedge_sent = asyncio.Event()
    dropped: list[str] = []

    async def send(hedge: bool) -> str:
        if hedge:
            hedge_sent.set()
            await asyncio.sleep(0)
            return "hedge: reset"
        await hedge_sent.wait()
        await asyncio.sleep(0.01)  # ends after the copy
        return "first: timeout"

    raced = await race(
        send,
        after_s=0.01,
        may_hedge=lambda: True,
        answered=lambda sent: sent.endswith("200"),
        dropped=dropped.append,
    )

    assert raced == Raced("first: timeout", hedged=True)
    assert dropped == ["hedge: reset"]


async def test_a_copy_the_budget_refuses_leaves_the_first_to_finish_alone():
    dropped: list[str] = []

    async def send(hedge: bool) -> str:
        assert not hedge
        await asyncio.sleep(0.02)
        return "first: 200"

    raced = await race(
        send, after_s=0.001, may_hedge=lambda: False, answered=bool, dropped=dropped.append
    )

    assert raced == Raced("first: 200", hedged=False)
    assert dropped == []
