"""The sidecar as a process: command line, JSON logs, readiness and a graceful drain."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from sidecar import __version__
from sidecar.build import COMPILED_MODULES
from tests.conftest import BUILD_UNDER_TEST, eventually, hang, unused_port
from tests.processes import RunningSidecar, run_cli, sidecar_process


def test_version_from_the_console_script_and_python_m_names_the_build():
    build = {"pure": "pure Python", "compiled": f"compiled: {len(COMPILED_MODULES)} modules"}
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"tool-retry-sidecar {__version__} ({build[BUILD_UNDER_TEST]})"

    module = subprocess.run(
        [sys.executable, "-m", "sidecar", "--version"], capture_output=True, text=True, timeout=30
    )
    assert module.stdout == result.stdout


def test_check_config_prints_the_effective_configuration_with_secrets_masked():
    result = run_cli(
        "check-config",
        "--upstream",
        "http://agent:hunter2@127.0.0.1:8080",
        env={"SIDECAR_LLM_API_KEY": "sk-very-secret", "SIDECAR_MAX_RETRIES": "4"},
    )

    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["max_retries"] == 4
    assert shown["llm_api_key"] == "***"
    assert shown["routes"][0]["name"] == "default"
    assert "sk-very-secret" not in result.stdout
    assert "hunter2" not in result.stdout


def test_bad_configuration_fails_with_one_line_and_exit_2():
    for command in ("check-config", "serve"):
        result = run_cli(command, env={"SIDECAR_UPSTREAM_URL": "http://x", "SIDECAR_PORT": "-1"})
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            "configuration error: port (SIDECAR_PORT): Input should be greater than or equal to 0"
        ]


async def until_draining(agent: aiohttp.ClientSession, sidecar: RunningSidecar) -> None:
    """Wait until ``/readyz`` answers 503: the same step closed the proxy's listener."""

    async def draining() -> bool:
        async with agent.get(f"{sidecar.admin}/readyz") as ready:
            return ready.status == 503

    await eventually(draining)


async def test_sigterm_drains_the_request_in_flight_then_exits_0(aiohttp_server):
    reached_tool, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        reached_tool.set()
        await release.wait()
        return web.json_response({"success": True})

    app = web.Application()
    app.router.add_post("/slow", slow)
    tool = await aiohttp_server(app)
    async with sidecar_process(str(tool.make_url("/"))) as sidecar:
        exit_code = asyncio.create_task(sidecar.read_lines_until_exit())
        async with aiohttp.ClientSession() as agent:
            async with agent.get(f"{sidecar.admin}/readyz") as ready:
                assert ready.status == 200
            in_flight = asyncio.create_task(agent.post(f"{sidecar.proxy}/slow", json={}))
            await asyncio.wait_for(reached_tool.wait(), timeout=5)

            sidecar.process.send_signal(signal.SIGTERM)
            await until_draining(agent, sidecar)
            async with aiohttp.ClientSession() as newcomer:
                with pytest.raises(aiohttp.ClientConnectionError):
                    await newcomer.get(f"{sidecar.proxy}/slow")

            release.set()  # the tool answers only now, while the sidecar drains
            response = await asyncio.wait_for(in_flight, timeout=5)
            assert response.status == 200
            assert await response.json() == {"success": True}

        assert await asyncio.wait_for(exit_code, timeout=10) == 0

    events = [json.loads(line)["event"] for line in sidecar.lines]
    assert events[0] == "sidecar_started"
    assert events[-2:] == ["shutdown_started", "sidecar_stopped"]
    assert all(line.startswith("{") for line in sidecar.lines)


async def test_drain_time_running_out_answers_waiting_calls_and_exits_in_time(aiohttp_server):
    reached_tool = asyncio.Event()

    async def hangs(request: web.Request) -> web.Response:
        reached_tool.set()
        await hang()

    app = web.Application()
    app.router.add_post("/hangs", hangs)
    tool = await aiohttp_server(app)
    drain_s = 3.0
    settings = {"SIDECAR_DRAIN_TIMEOUT_MS": str(int(drain_s * 1000)), "SIDECAR_LOG_LEVEL": "debug"}
    async with sidecar_process(str(tool.make_url("/")), settings) as sidecar:
        exit_code = asyncio.create_task(sidecar.read_lines_until_exit())
        async with aiohttp.ClientSession() as agent:
            in_flight = asyncio.create_task(agent.post(f"{sidecar.proxy}/hangs", json={}))
            await asyncio.wait_for(reached_tool.wait(), timeout=5)
            signalled = asyncio.get_running_loop().time()
            sidecar.process.send_signal(signal.SIGTERM)

            response = await asyncio.wait_for(in_flight, timeout=10)
            body = await response.json()
            assert await asyncio.wait_for(exit_code, timeout=10) == 0
            exited_after = asyncio.get_running_loop().time() - signalled

    assert response.status == 504
    assert body["error"]["code"] == "UPSTREAM_TIMEOUT"
    assert body["error"]["details"]["reason"] == "shutdown"
    finished = [json.loads(line) for line in sidecar.lines if '"request_done"' in line]
    assert [(line["outcome"], line["status"]) for line in finished] == [("deadline", 504)]
    # The drain time, then a moment to answer and stop; 0.1 took twice the drain time.
    assert exited_after < drain_s + 2


async def test_running_out_of_file_descriptors_is_logged_as_the_sidecars_own_overload():
    async with sidecar_process(f"http://127.0.0.1:{unused_port()}", max_fds=64) as sidecar:
        port = int(sidecar.proxy.rsplit(":", 1)[1])
        agents = [socket.create_connection(("127.0.0.1", port)) for _ in range(80)]
        try:
            assert sidecar.process.stdout is not None
            line = await asyncio.wait_for(sidecar.process.stdout.readline(), timeout=10)
        finally:
            for agent in agents:
                agent.close()

    event = json.loads(line)
    assert (event["event"], event["reason"], event["level"]) == (
        "sidecar_overloaded",
        "fd_exhausted",
        "error",
    )


@pytest.mark.slow
async def test_sigterm_with_fifty_requests_in_flight_answers_them_all(aiohttp_server):
    arrived = 0
    all_arrived, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        nonlocal arrived
        arrived += 1
        if arrived == 50:
            all_arrived.set()
        await release.wait()
        return web.json_response({"n": arrived})

    app = web.Application()
    app.router.add_post("/slow", slow)
    tool = await aiohttp_server(app)
    async with sidecar_process(str(tool.make_url("/"))) as sidecar:
        exit_code = asyncio.create_task(sidecar.read_lines_until_exit())
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as agent:

            async def call() -> int:
                async with agent.post(f"{sidecar.proxy}/slow", json={}) as response:
                    await response.read()
                    return response.status

            calls = [asyncio.create_task(call()) for _ in range(50)]
            await asyncio.wait_for(all_arrived.wait(), timeout=10)
            sidecar.process.send_signal(signal.SIGTERM)
            await until_draining(agent, sidecar)
            release.set()
            statuses = await asyncio.wait_for(asyncio.gather(*calls), timeout=10)

        assert statuses == [200] * 50
        assert await asyncio.wait_for(exit_code, timeout=10) == 0
