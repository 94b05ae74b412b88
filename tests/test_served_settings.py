"""The served records (``config.served``) hold what the models validated, field for field,
and ``serve`` continues in an interpreter that never loads pydantic."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import signal
import sys
from pathlib import Path

from sidecar.config import TUNING_FIELDS, Settings, load_settings
from sidecar.config.served import RouteConfig, Secret, ServedSettings, ServedTuning
from tests.processes import clean_env, kill_if_running, sidecar_process


def mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def field_names(record: type) -> set[str]:
    return {field.name for field in dataclasses.fields(record)}


def test_a_served_tuning_has_every_tuning_field_and_nothing_else():
    assert field_names(ServedTuning) == set(TUNING_FIELDS)


def test_every_served_setting_is_a_setting_of_the_model():
    assert field_names(ServedSettings) - {"route_configs"} <= set(Settings.model_fields)


def test_served_settings_copy_the_validated_values(tmp_path: Path):
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        "routes:\n"
        "  - {name: weather, prefix: /weather, upstream: 'http://weather:8080', max_retries: 5}\n"
        "  - {name: search, prefix: /search, upstream: 'http://search:8080', repair: 'off'}\n"
    )
    settings = load_settings(
        config_file=config,
        admin_allowed_hosts="a.internal,b.internal",
        llm_base_url="http://model:8000/v1",
        llm_api_key="sk-test",
        state_url="redis://store:6379/0",
        retry_on_status="429,503",
        backoff_base_ms="50ms",
    )

    served = settings.served()

    for name in field_names(ServedSettings) - {"route_configs", "llm_api_key", "state_url"}:
        model_value = getattr(settings, name)
        expected = str(model_value) if name == "llm_base_url" else model_value
        assert getattr(served, name) == expected, name
    assert served.llm_api_key == Secret("sk-test")
    assert served.state_url == Secret("redis://store:6379/0")
    assert served.route_configs == settings.route_configs
    [weather, search] = served.route_configs
    assert isinstance(weather, RouteConfig) and isinstance(weather.tuning, ServedTuning)
    assert (weather.tuning.max_retries, search.tuning.max_retries) == (5, 10)
    assert (weather.tuning.repair, search.tuning.repair) == ("auto", "off")
    assert weather.tuning.retry_on_status == frozenset({429, 503})
    assert weather.tuning.backoff_base_ms == 50


def test_served_settings_cross_to_the_served_interpreter_whole_and_keep_secrets_out_of_reprs():
    served = load_settings(upstream_url="http://tool:8080", llm_api_key="sk-test").served()

    assert pickle.loads(pickle.dumps(served)) == served
    assert "sk-test" not in repr(served)
    assert served.llm_api_key is not None and served.llm_api_key.get_secret_value() == "sk-test"


async def test_serve_continues_in_the_same_process_without_pydantic():
    async with sidecar_process("http://127.0.0.1:9", {"SIDECAR_NOT_A_SETTING": "1"}) as sidecar:
        maps = mapped_files(sidecar.process.pid)
        command = command_line(sidecar.process.pid)
        exit_code = sidecar.read_lines_until_exit()
        sidecar.process.send_signal(signal.SIGTERM)
        assert await exit_code == 0

    assert "pydantic_core" not in maps
    # What was started still shows in ps: the served interpreter carries it along.
    assert command[-8:-1] == [
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--port",
        "0",
        "--admin-port",
        "0",
    ]
    assert command[-9].endswith("tool-retry-sidecar")
    assert "uvloop" in maps
    events = [json.loads(line)["event"] for line in sidecar.lines]
    # The warning the validating interpreter logged comes before the served one's lines.
    assert events[0] == "unknown_variable"
    assert events[1:] == ["sidecar_started", "shutdown_started", "sidecar_stopped"]


# ``serve`` on a system without ``memfd_create`` (not Linux, or a seccomp profile that
# refuses it): the os module has none, as there.
WITHOUT_MEMFD = """
import os, sys
del os.memfd_create
from sidecar.cli import main
sys.exit(main(sys.argv[1:]))
"""


async def test_without_an_in_memory_file_the_validating_interpreter_serves():
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", WITHOUT_MEMFD, "serve", "--upstream", "http://127.0.0.1:9"),
        *("--port", "0", "--admin-port", "0"),
        env=clean_env(SIDECAR_HOST="127.0.0.1"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        started = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=20))
        maps = mapped_files(process.pid)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        await kill_if_running(process)

    assert started["event"] == "sidecar_started"
    assert "pydantic_core" in maps
