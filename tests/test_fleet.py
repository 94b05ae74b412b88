"""Fleet state on a real Redis-compatible server: what one sidecar learns, every replica
acts on."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from sidecar.config import ConfigError, load_settings, masked, unknown_variables
from tests.conftest import FakeClock, eventually, unused_port
from tests.processes import RunningSidecar, sidecar_process
from tests.redis_store import RedisServer

ROOT = Path(__file__).resolve().parent.parent


# Tests that check what replicas share give the store far more than its default 25 ms: on
# a busy shared machine a call may take longer, and a timed-out call shares nothing. The
# timeout itself is tested with a frozen store.
SHARING_TIMEOUT_MS = 2000


def shared(store: RedisServer) -> dict[str, object]:
    return {"state_url": store.url, "state_timeout_ms": SHARING_TIMEOUT_MS}


def shared_env(store: RedisServer) -> dict[str, str]:
    return {"SIDECAR_STATE_URL": store.url, "SIDECAR_STATE_TIMEOUT_MS": str(SHARING_TIMEOUT_MS)}


def rate_limited(seconds: int) -> web.Response:
    return web.json_response(
        {"error": "slow down"}, status=429, headers={"Retry-After": str(seconds)}
    )


def ok() -> web.Response:
    return web.json_response({"success": True})


def keys(store: RedisServer) -> set[str]:
    return {key.decode() for key in store.contents()}


def tool_keys(tool: str, route: str = "default") -> str:
    """Where a tool's cooldowns and circuit window live (the ``tool`` circuit scope)."""
    return f"sidecar:{{{route}}}:tool:{hashlib.sha256(tool.encode()).hexdigest()[:32]}:"


FORECAST = tool_keys("/forecast")


async def test_a_wait_one_replica_learned_holds_back_the_first_attempt_of_another(
    make_tool, make_sidecar, redis_store
):
    # The store's keys expire in real time, so these replicas wait in real time too.
    reset = web.json_response(
        {"error": "slow down"}, status=429, headers={"RateLimit-Reset": "0.5"}
    )
    answers = iter([reset])
    tool = await make_tool(lambda _: asyncio.sleep(0, next(answers, ok())))
    first = await make_sidecar(tool, **shared(redis_store), sleep=asyncio.sleep)
    second = await make_sidecar(tool, **shared(redis_store), sleep=asyncio.sleep)

    learning = asyncio.create_task(first.client.post("/forecast", json={"city": "Oslo"}))
    await eventually(lambda: FORECAST + "cooldown" in keys(redis_store))
    waited = await second.client.post("/forecast", json={"city": "Oslo"})
    learned = await learning

    assert learned.status == waited.status == 200
    assert learned.headers["X-Sidecar-Trail"].startswith("429 retry_after=")
    assert waited.headers["X-Sidecar-Attempts"] == "1"
    assert waited.headers["X-Sidecar-Trail"].startswith("cooldown=")
    assert len(tool.seen) == 3


async def test_a_route_that_opts_out_neither_reads_nor_writes_the_fleet_state(
    make_tool, make_sidecar, redis_store
):
    tool = await make_tool(lambda _: asyncio.sleep(0, rate_limited(7)))
    sharing = await make_sidecar(tool, **shared(redis_store), max_retries=0)
    await sharing.client.post("/forecast", json={})
    before = redis_store.contents()
    assert before

    own = [{"name": "default", "prefix": "/", "upstream": tool.url, "shared_state": False}]
    alone = await make_sidecar(None, **shared(redis_store), routes=own, max_retries=0)
    answer = await alone.client.post("/forecast", json={})

    assert answer.status == 429
    assert alone.sleep.waits == []
    assert len(tool.seen) == 2
    assert redis_store.contents() == before


async def test_a_cooldown_longer_than_a_request_may_wait_is_answered_at_once(
    make_tool, make_sidecar, redis_store
):
    tool = await make_tool(lambda _: asyncio.sleep(0, rate_limited(120)))
    first = await make_sidecar(tool, **shared(redis_store))
    second = await make_sidecar(tool, **shared(redis_store))

    # Past max_retry_after (60 s) the tool's 429 goes back at once, and the fleet learns it.
    assert (await first.client.post("/forecast", json={})).status == 429

    refused = await second.client.post("/forecast", json={})

    assert refused.status == 503
    assert (await refused.json())["error"]["code"] == "CIRCUIT_OPEN"
    assert 100 < int(refused.headers["Retry-After"]) <= 120
    assert second.sleep.waits == []
    assert len(tool.seen) == 1


async def test_a_cooldown_a_replica_knows_holds_while_the_store_is_gone(
    make_tool, make_sidecar, redis_store
):
    tool = await make_tool(lambda _: asyncio.sleep(0, rate_limited(120)))
    learned = await make_sidecar(tool, **shared(redis_store))
    told = await make_sidecar(tool, **shared(redis_store))
    assert (await learned.client.post("/forecast", json={})).status == 429
    assert (await told.client.post("/forecast", json={})).status == 503

    redis_store.kill()

    for sidecar in (learned, told):
        refused = await sidecar.client.post("/forecast", json={})
        assert refused.status == 503
        assert (await refused.json())["error"]["code"] == "CIRCUIT_OPEN"
        assert 100 < int(refused.headers["Retry-After"]) <= 120
    assert len(tool.seen) == 1


async def test_a_wait_in_the_envelope_holds_back_its_path_only(
    make_tool, make_sidecar, redis_store
):
    busy = {
        "success": False,
        "error": {"code": "BUSY", "retryable": True, "details": {"retry_after": "90s"}},
    }
    tool = await make_tool(
        lambda request: asyncio.sleep(
            0, web.json_response(busy, status=503) if request.path == "/busy" else ok()
        )
    )
    first = await make_sidecar(tool, **shared(redis_store))
    second = await make_sidecar(tool, **shared(redis_store))
    assert (await first.client.post("/busy", json={})).status == 503

    refused = await second.client.post("/busy", json={})
    other_path = await second.client.post("/calm", json={})

    assert refused.status == 503
    assert (await refused.json())["error"]["code"] == "CIRCUIT_OPEN"
    assert other_path.status == 200
    assert [seen.raw_path for seen in tool.seen] == ["/busy", "/calm"]


async def test_the_circuit_counts_failures_across_the_fleet(make_tool, make_sidecar, redis_store):
    """The fleet's window holds the evidence: the circuit opens once the replicas together
    have seen ``circuit_min_calls`` calls, though neither has alone."""
    tool = await make_tool(lambda _: asyncio.sleep(0, web.json_response({}, status=503)))
    guarded = {
        **shared(redis_store),
        "max_retries": 0,
        "circuit_failures": 4,
        "circuit_min_calls": 6,
        "circuit_open_ms": 90000,
    }
    first = await make_sidecar(tool, **guarded)
    second = await make_sidecar(tool, **guarded)

    def state(sidecar) -> float | None:
        return sidecar.registry.get_sample_value(
            "sidecar_circuit_state", {"route": "default", "tool": "/forecast"}
        )

    for sidecar in (first, second) * 2:
        assert (await sidecar.client.post("/forecast", json={})).status == 503
    # Four failed calls, past circuit_failures, but short of the six calls a rate needs.
    assert state(first) == state(second) == 0
    for sidecar in (first, second):
        assert (await sidecar.client.post("/forecast", json={})).status == 503
    # Each replica saw three calls, the fleet six: the last one opened the circuit.
    assert state(second) == 2
    assert state(first) == 0

    refused = await first.client.post("/forecast", json={})

    assert (await refused.json())["error"]["code"] == "CIRCUIT_OPEN"
    assert 80 < int(refused.headers["Retry-After"]) <= 90
    assert len(tool.seen) == 6


async def test_a_store_that_is_frozen_or_gone_costs_a_count_and_changes_no_answer(
    make_tool, make_sidecar, redis_store
):
    tool = await make_tool(lambda _: asyncio.sleep(0, ok()))
    frozen = await make_sidecar(tool, state_url=redis_store.url, state_timeout_ms=50)
    gone = await make_sidecar(tool, state_url=f"redis://127.0.0.1:{unused_port()}/0")
    redis_store.pause()
    try:
        for sidecar in (frozen, gone):
            answer = await sidecar.client.post("/forecast", json={})
            assert answer.status == 200
            assert answer.headers["X-Sidecar-Outcome"] == "ok"
            assert sidecar.metric("sidecar_state_errors_total", op="cooldown_read") >= 1
    finally:
        redis_store.resume()


async def test_a_store_that_refuses_the_password_costs_a_count_and_changes_no_answer(
    make_tool, make_sidecar, tmp_path
):
    guarded = RedisServer(tmp_path, password="right-password")
    guarded.start()
    try:
        tool = await make_tool(lambda _: asyncio.sleep(0, rate_limited(1)))
        wrong = f"redis://:wrong-password@127.0.0.1:{guarded.port}/0"
        # The waits move this clock, so the cooldown the sidecar learned itself ends in them.
        sidecar = await make_sidecar(tool, state_url=wrong, max_retries=1, clock=FakeClock())

        answer = await sidecar.client.post("/forecast", json={})

        assert answer.status == 429
        assert answer.headers["X-Sidecar-Attempts"] == "2"
        assert sidecar.metric("sidecar_state_errors_total", op="cooldown_read") >= 1
        assert guarded.contents() == {}
    finally:
        guarded.kill()


def test_the_store_url_takes_redis_and_valkey_schemes_and_is_shown_masked():
    for scheme in ("redis", "rediss", "valkey", "valkeys"):
        load_settings(upstream_url="http://tool", state_url=f"{scheme}://store:6379/0")
    with pytest.raises(ConfigError, match="state_url"):
        load_settings(upstream_url="http://tool", state_url="http://store:6379")

    settings = load_settings(upstream_url="http://tool", state_url="redis://:hunter2@store/0")
    assert "hunter2" not in str(masked(settings))
    assert "hunter2" not in repr(settings)


async def _answer_ok(_: web.Request) -> web.Response:
    return ok()


class CoolingTool:
    """A tool that answers the first request ``429 Retry-After: 1`` and counts every
    request that arrives while that second lasts."""

    def __init__(self) -> None:
        self.requests = 0
        self.during_cooldown = 0
        self.cooling_until = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        now = time.monotonic()
        if now < self.cooling_until:
            self.during_cooldown += 1
            return rate_limited(1)
        if self.requests == 1:
            self.cooling_until = now + 1
            return rate_limited(1)
        return ok()


async def _replicas(
    stack: contextlib.AsyncExitStack, upstream: str, count: int, env: dict[str, str]
) -> list[RunningSidecar]:
    """``count`` sidecar processes sharing ``env``, each one's log lines read as they come."""
    replicas = await asyncio.gather(
        *(stack.enter_async_context(sidecar_process(upstream, env)) for _ in range(count))
    )
    for replica in replicas:
        reading = asyncio.create_task(replica.read_lines_until_exit())
        stack.push_async_callback(_stop_reading, reading)
    return list(replicas)


async def _stop_reading(reading: asyncio.Task[int]) -> None:
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading


async def _metric(agent: aiohttp.ClientSession, sidecar: RunningSidecar, series: str) -> float:
    async with agent.get(f"{sidecar.admin}/metrics") as answer:
        text = await answer.text()
    values = [float(v) for v in re.findall(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)]
    return sum(values)


@pytest.mark.slow
async def test_three_replicas_send_nothing_while_the_tool_cools_down(aiohttp_server, redis_store):
    tool = CoolingTool()
    app = web.Application()
    app.router.add_post("/forecast", tool.handle)
    server = await aiohttp_server(app)
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as agent:
        learner, *others = await _replicas(
            stack, str(server.make_url("/")), 3, shared_env(redis_store)
        )
        learning = asyncio.create_task(agent.post(f"{learner.proxy}/forecast", json={}))
        await eventually(lambda: FORECAST + "cooldown" in keys(redis_store))

        answers = await asyncio.gather(
            learning, *(agent.post(f"{other.proxy}/forecast", json={}) for other in others)
        )

        assert [answer.status for answer in answers] == [200, 200, 200]
        assert [answer.headers["X-Sidecar-Attempts"] for answer in answers] == ["2", "1", "1"]
        assert tool.during_cooldown == 0
        assert tool.requests == 4


@pytest.mark.slow
async def test_the_store_killed_mid_run_and_restarted(aiohttp_server, redis_store):
    app = web.Application()
    app.router.add_post("/forecast", _answer_ok)
    server = await aiohttp_server(app)
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as agent:
        replicas = await _replicas(stack, str(server.make_url("/")), 2, shared_env(redis_store))

        async def every_replica_answers() -> None:
            for replica in replicas:
                async with agent.post(f"{replica.proxy}/forecast", json={}) as answer:
                    assert answer.status == 200
                    assert answer.headers["X-Sidecar-Outcome"] == "ok"

        await every_replica_answers()
        assert any(key.startswith(FORECAST + "window:") for key in keys(redis_store))

        redis_store.kill()
        await every_replica_answers()
        for replica in replicas:
            errors = await _metric(agent, replica, 'sidecar_state_errors_total{op="cooldown_read"}')
            assert errors >= 1
            await eventually(
                lambda replica=replica: any(
                    line.get("event") == "state_store_unavailable" for line in replica.logged()
                )
            )

        redis_store.start()

        async def written_again() -> bool:
            await every_replica_answers()
            return any(key.startswith(FORECAST + "window:") for key in keys(redis_store))

        await eventually(written_again, timeout_s=10)


def test_the_fleet_compose_file_sets_only_real_settings():
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.fleet.yml").read_text())
    sidecars = [service for name, service in compose["services"].items() if "sidecar" in name]
    assert len(sidecars) == 2
    for sidecar in sidecars:
        environment = sidecar["environment"]
        assert unknown_variables(environment) == []
        load_settings(
            upstream_url=environment["SIDECAR_UPSTREAM_URL"],
            state_url=environment["SIDECAR_STATE_URL"],
        )


CORRECT_CITY = "Flower Mound, Texas, US"
API_KEY = "sk-live-0123456789abcdef"


async def _weather(request: web.Request) -> web.Response:
    """Knows a city only as 'City, State, Country', and echoes the key it was sent."""
    payload = await request.json()
    if payload.get("location") == CORRECT_CITY:
        return web.json_response({"success": True, "key": payload.get("api_key")})
    failure = {
        "code": "LOCATION_NOT_FOUND",
        "message": f"City '{payload.get('location')}' not found (key {payload.get('api_key')})",
        "category": "NOT_FOUND",
        "retryable": True,
    }
    return web.json_response({"success": False, "error": failure}, status=404)


@pytest.mark.slow
async def test_one_model_call_repairs_an_identical_failure_on_every_replica(
    aiohttp_server, make_llm, redis_store
):
    llm = await make_llm(
        {
            "can_fix": True,
            "analysis": "the tool wants the full place name",
            "corrected_payload": {"location": CORRECT_CITY, "api_key": "<redacted-1>"},
            "is_transient": False,
        }
    )
    app = web.Application()
    app.router.add_post("/weather", _weather)
    server = await aiohttp_server(app)
    env = {**shared_env(redis_store), "SIDECAR_LLM_BASE_URL": llm.base_url}
    call = {"location": "Flower Mound, TX", "api_key": API_KEY}
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as agent:
        replicas = await _replicas(stack, str(server.make_url("/")), 3, env)
        answers = []
        for replica in replicas:
            async with agent.post(
                f"{replica.proxy}/weather", json=call, headers={"Authorization": "Bearer agt-0042"}
            ) as answer:
                answers.append(
                    (answer.status, answer.headers["X-Sidecar-Repaired"], await answer.json())
                )

    assert answers == [(200, "llm", {"success": True, "key": API_KEY})] * 3
    assert len(llm.requests) == 1
    stored = redis_store.contents()
    [answer] = [value for key, value in stored.items() if b":repair:" in key]
    assert orjson.loads(answer)["corrected"] == {
        "location": CORRECT_CITY,
        "api_key": "<redacted-1>",
    }
    for key, value in stored.items():
        for secret in (API_KEY.encode(), b"agt-0042"):
            assert secret not in key
            assert secret not in value


def test_the_store_comes_from_the_dev_extra_not_the_path(tmp_path, monkeypatch):
    # A machine with Python alone has no redis-server anywhere: the fleet tests must find
    # their server through the dev extra's wheel, never skip or fail for want of one.
    monkeypatch.setenv("PATH", str(tmp_path))
    server = RedisServer(tmp_path)
    server.start()
    try:
        client = server.client()
        assert client.ping()
        client.close()
    finally:
        server.kill()


async def test_a_wait_one_tool_asked_for_holds_back_that_tool_only_across_the_fleet(
    make_tool, make_sidecar, redis_store
):
    async def forecast_limited(request: web.Request) -> web.Response:
        await request.read()
        return rate_limited(7) if request.path == "/forecast" else ok()

    tool = await make_tool(forecast_limited)
    settings = {**shared(redis_store), "max_retries": 0, "max_retry_after_ms": 1000}
    learner = await make_sidecar(tool, **settings)
    other = await make_sidecar(tool, **settings)

    assert (await learner.client.post("/forecast", json={})).status == 429
    held_back = await other.client.post("/forecast", json={})
    neighbour = await other.client.post("/geocode", json={})

    assert (await held_back.json())["error"]["details"]["tool"] == "/forecast"
    assert held_back.headers["X-Sidecar-Attempts"] == "0"
    assert neighbour.status == 200
    assert neighbour.headers["X-Sidecar-Trail"] == "200"
    assert [seen.raw_path for seen in tool.seen] == ["/forecast", "/geocode"]
    assert FORECAST + "cooldown" in keys(redis_store)


async def test_with_the_route_scope_the_fleet_keeps_the_routes_own_keys(
    make_tool, make_sidecar, redis_store
):
    tool = await make_tool(lambda _: asyncio.sleep(0, rate_limited(7)))
    sidecar = await make_sidecar(tool, **shared(redis_store), circuit_scope="route", max_retries=0)

    await sidecar.client.post("/forecast", json={})

    assert "sidecar:{default}:cooldown" in keys(redis_store)
    assert not any(":tool:" in key for key in keys(redis_store))
