"""Start-up and configuration failures: one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.processes import CONSOLE_SCRIPT, clean_env, run_cli, sidecar_process

UPSTREAM = "http://127.0.0.1:1"


@dataclass(frozen=True)
class Case:
    """A way to start the sidecar that must fail. ``{busy}`` in ``args`` or ``env`` is a port
    something else listens on; ``config`` is written to a file named by ``--config``."""

    expected: str
    args: tuple[str, ...] = ("serve", "--upstream", UPSTREAM)
    env: dict[str, str] = field(default_factory=dict)
    config: bytes | None = None


LOOPBACK = {"SIDECAR_HOST": "127.0.0.1", "SIDECAR_ADMIN_HOST": "127.0.0.1"}
CASES = {
    "proxy port in use": Case(
        "cannot listen on 127.0.0.1:{busy}, the proxy port (SIDECAR_PORT): address already in use",
        ("--upstream", UPSTREAM, "--port", "{busy}", "--admin-port", "0"),
        LOOPBACK,
    ),
    "admin port in use": Case(
        "cannot listen on 127.0.0.1:{busy}, the admin port (SIDECAR_ADMIN_PORT): address already",
        ("serve", "--upstream", UPSTREAM, "--port", "0", "--admin-port", "{busy}"),
        LOOPBACK,
    ),
    "admin port is the proxy port": Case(
        "port (SIDECAR_PORT) and admin_port (SIDECAR_ADMIN_PORT) are both 18090",
        env={"SIDECAR_PORT": "18090", "SIDECAR_ADMIN_PORT": "18090"},
    ),
    "host is no address": Case(
        "cannot listen on 999.999.999.999 (SIDECAR_HOST): not an address of this machine",
        env={"SIDECAR_HOST": "999.999.999.999"},
    ),
    "host does not resolve": Case(
        "cannot listen on no-such-host.invalid (SIDECAR_HOST)",
        env={"SIDECAR_HOST": "no-such-host.invalid"},
    ),
    "admin host does not resolve": Case(
        "cannot listen on no-such-host.invalid (SIDECAR_ADMIN_HOST)",
        env={"SIDECAR_ADMIN_HOST": "no-such-host.invalid"},
    ),
    "key is not a string": Case(
        "has a key that is not a setting name (1)", config=b"max_retries: 2\n1: one\n"
    ),
    "file is not utf-8": Case("is not UTF-8 text (byte 15)", config=b"llm_model: caf\xe9\n"),
    "5,000 nested lists": Case("nests too deeply", config=b"routes: " + b"[" * 5000 + b"]" * 5000),
    "overrides is not a mapping": Case(
        "routes.0: overrides is not a route key",
        config=b"routes: [{name: a, upstream: 'http://a', overrides: 5}]",
    ),
    "duration past 2**64": Case(
        "drain_timeout_ms (SIDECAR_DRAIN_TIMEOUT_MS): Input should be less than or equal to",
        ("check-config", "--upstream", UPSTREAM),
        {"SIDECAR_DRAIN_TIMEOUT_MS": str(2**64)},
    ),
    "a boolean for a port": Case(
        "port in the config file: must be a number, not true or false", config=b"port: true\n"
    ),
    "a boolean for a count": Case(
        "routes[0] (a).max_retries: must be a number, not true or false",
        config=b"routes: [{name: a, prefix: /a, upstream: 'http://a', max_retries: yes}]",
    ),
    "unknown key in the file": Case(
        "max_retrys in the config file is not a setting; "
        "did you mean max_retries (SIDECAR_MAX_RETRIES)?",
        config=b"max_retrys: 5\n",
    ),
    "unknown key on a route": Case(
        "routes.0.strip_prefx is not a route setting; did you mean strip_prefix?",
        config=b"routes: [{name: a, upstream: 'http://a', strip_prefx: true}]",
    ),
    "routes variable is not JSON": Case(
        'error parsing value for field "routes"', env={"SIDECAR_ROUTES": "[{name: a"}
    ),
}


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.socket() as occupant:
        occupant.bind(("127.0.0.1", 0))
        occupant.listen()
        yield occupant.getsockname()[1]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_start_that_cannot_succeed_says_why_in_one_line(
    case: Case, busy_port: int, tmp_path: Path
):
    args = [arg.format(busy=busy_port) for arg in case.args]
    if case.config is not None:
        (tmp_path / "sidecar.yaml").write_bytes(case.config)
        args += ["--config", str(tmp_path / "sidecar.yaml")]

    result = run_cli(*args, env={**case.env})

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    [line] = result.stderr.splitlines()
    assert case.expected.format(busy=busy_port) in line
    assert "sidecar_started" not in result.stdout


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_tracing_without_the_otel_extra_names_the_install_command(command, tmp_path: Path):
    # An empty ``opentelemetry`` package first on the path hides the installed one, as a
    # plain ``pip install tool-retry-sidecar`` (no extras) leaves it.
    (tmp_path / "opentelemetry").mkdir()
    (tmp_path / "opentelemetry" / "__init__.py").write_text("")
    env = {"PYTHONPATH": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}

    result = run_cli(command, "--upstream", UPSTREAM, "--port", "0", "--admin-port", "0", env=env)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.splitlines() == [
        "configuration error: tracing (OTEL_EXPORTER_OTLP_ENDPOINT) needs the otel extra, "
        "which is not installed: pip install 'tool-retry-sidecar[otel]'"
    ]
    assert "sidecar_started" not in result.stdout


def test_unknown_sidecar_variables_are_named_with_the_likely_setting():
    result = run_cli(
        "check-config",
        env={"SIDECAR_UPSTREAM_URL": UPSTREAM, "SIDECAR_MAX_RETRYS": "5", "SIDECAR_ZZZ": "1"},
    )

    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "warning: SIDECAR_MAX_RETRYS is not a setting and is ignored; "
        "did you mean SIDECAR_MAX_RETRIES?",
        "warning: SIDECAR_ZZZ is not a setting and is ignored",
    ]


async def test_serve_logs_unknown_variables_as_warnings_and_starts():
    env = {"SIDECAR_ACCES_LOG": "true"}
    async with sidecar_process(UPSTREAM, env) as sidecar:
        sidecar.process.send_signal(signal.SIGTERM)
        assert await sidecar.read_lines_until_exit() == 0

    [warning] = [line for line in sidecar.logged() if line["event"] == "unknown_variable"]
    assert warning["level"] == "warning"
    assert warning["variable"] == "SIDECAR_ACCES_LOG"
    assert warning["reason"].endswith("did you mean SIDECAR_ACCESS_LOG?")


async def test_serve_is_the_default_command_also_with_its_flags():
    async with sidecar_process(UPSTREAM, command=()) as sidecar:
        sidecar.process.send_signal(signal.SIGTERM)
        assert await sidecar.read_lines_until_exit() == 0


@pytest.mark.parametrize(
    "command", [("check-config", "--upstream", UPSTREAM), ("demo",)], ids=["check-config", "demo"]
)
def test_output_into_a_reader_that_left_is_quiet(command):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (``| head``) is gone before anything is written
    try:
        result = subprocess.run(
            [CONSOLE_SCRIPT, *command],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=clean_env(),
        )
    finally:
        os.close(write_end)

    assert "Traceback" not in result.stderr
    assert result.returncode == 0
