"""The README's first command: the demo plays every scenario and leaves nothing running."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import subprocess
import sys

import aiohttp
import pytest

from sidecar.demo.run import SCENARIOS, run_demo
from sidecar.demo.tool import KNOWN_CITIES
from tests.processes import kill_if_running


def scenario_blocks(output: str) -> dict[int, str]:
    blocks = re.split(r"\n(?=\d\. )", output)
    return {int(block[0]): block for block in blocks if block[:1].isdigit()}


def sent_and_received(block: str) -> tuple[str, str]:
    """The body on the scenario's 'agent sent' line and on its last 'tool got' line."""
    sent = re.search(r"agent sent   \S+ \S+ (.*)", block).group(1)
    received = re.findall(r"tool got (.*) -> \d+", block)[-1]
    return sent, received


async def test_demo_with_a_model_recovers_every_scenario(make_llm):
    city = next(name for name in KNOWN_CITIES if name.startswith("Flower Mound"))
    llm = await make_llm(
        {
            "can_fix": True,
            "analysis": "the tool wants City, State, Country",
            "corrected_payload": {"location": city, "units": "metric"},
            "is_transient": False,
        }
    )
    out = io.StringIO()

    exit_code = await run_demo(out, settings_overrides={"llm_base_url": llm.base_url})

    output = out.getvalue()
    assert exit_code == 0, output
    blocks = scenario_blocks(output)
    assert len(blocks) == len(SCENARIOS) == 6
    assert "503 backoff=" in blocks[1] and "agent got    200 (recovered)" in blocks[1]
    # Retry-After: 1, spread by up to a quarter so that callers do not come back together.
    assert re.search(r"429 retry_after=1(\.\d+)?s, 200", blocks[2])
    assert "repaired by coercion" in blocks[3] and re.search(r'"lat": ?35\.6\b', blocks[3])
    assert "400 repair=adjustment, 200" in blocks[4]
    assert "404 repair=llm, 200" in blocks[5] and "repaired by llm" in blocks[5]
    assert "agent got    401 (not-retryable)" in blocks[6]
    # The agent's line shows the bytes it sent: a body the sidecar did not change reads the
    # same at the tool, and a coerced one differs only in the value that was coerced.
    assert sent_and_received(blocks[1]) == ('{"location":"Tokyo, Japan","burst":true}',) * 2
    assert sent_and_received(blocks[3]) == (
        '{"lat":"35.6","lon":"139.7","hourly":"true"}',
        '{"lat":35.6,"lon":139.7,"hourly":true}',
    )
    assert "sidecar_retries_total{reason=server_error}" in output
    assert "sidecar_llm_requests_total{result=ok}" in output
    assert len(llm.requests) == 1
    sidecar_url = re.search(r"sidecar at (http://\S+)", output).group(1)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(sidecar_url)


def test_demo_command_without_a_model_says_so_and_exits_0():
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SIDECAR_", "OPENAI_", "GOMIND_"))
    }

    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    blocks = scenario_blocks(result.stdout)
    heading = blocks[5].splitlines()[0]
    assert "LLM" in heading and "repaired" not in heading and "none is configured" in heading
    assert "this scenario needs an LLM" in blocks[5]
    assert "agent got    404 (not-retryable)" in blocks[5]
    assert "LOCATION_NOT_FOUND" in blocks[5]
    # A long body is cut between words, and says so.
    for line in result.stdout.splitlines():
        if " … (" in line:
            assert re.search(r'[\s,:{}\[\]"\d] … \(\d+ bytes in all\)$', line), line
    assert " … (" in blocks[5]
    # The summary is the sidecar's own counters, not the process's.
    summary = result.stdout.split("Summary, from the sidecar's /metrics:\n")[1]
    rows = [line.split()[0] for line in summary.splitlines()[1:] if line.startswith("  ")]
    assert rows and all(row.startswith("sidecar_") for row in rows), rows
    assert result.stderr == ""


async def test_keep_running_serves_until_sigterm():
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SIDECAR_", "OPENAI_", "GOMIND_"))
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "demo",
        "--keep-running",
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        lines = []
        while not lines or "Ctrl-C to stop" not in lines[-1]:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
            assert line, "".join(lines)
            lines.append(line.decode())
        sidecar_url = re.search(r"sidecar at (http://\S+)", "".join(lines)).group(1)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{sidecar_url}/weather/point", json={"lat": "1.5", "lon": "2"}
            ) as response,
        ):
            assert response.status == 200
            assert response.headers["X-Sidecar-Repaired"] == "coercion"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        await kill_if_running(process)
