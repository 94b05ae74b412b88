"""The documentation says what the code does.

The configuration reference lists every setting with its variable and default, compared
with the pydantic models; the README's first screen holds what a newcomer needs, and its
agent snippet works against a real tool behind a real sidecar.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic.fields import FieldInfo

from sidecar.config import (
    ENV_PREFIX,
    RouteSpec,
    Settings,
    Tuning,
    load_settings,
    resolve_routes,
)
from sidecar.telemetry.metric_definitions import Metrics
from tests.conftest import unused_port

ROOT = Path(__file__).parent.parent
CONFIGURATION = ROOT / "docs" / "configuration.md"
README = ROOT / "README.md"
FIRST_SCREEN_LINES = 60
# CI and the team run these two lines as they are written.
README_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && tool-retry-sidecar demo",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && pytest",
)
# Not a key: it collects the settings written on a route, which the settings table lists.
INTERNAL_ROUTE_FIELDS = {"overrides"}


def tables(markdown: str) -> dict[str, dict[str, str]]:
    """Each table's first two columns (name -> default), under the heading above it."""
    found: dict[str, dict[str, str]] = {}
    heading = ""
    for line in markdown.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0].startswith("`"):
            found.setdefault(heading, {})[cells[0].strip("`")] = cells[1]
    return found


def documented_default(cell: str) -> Any:
    """A default as the table writes it: `1000`, `0.2`, `full`, `500,502`, none, required."""
    if cell in ("none", "required"):
        return cell
    text = cell.strip("`")
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"\d+(,\d+)+", text):
        return frozenset(int(part) for part in text.split(","))
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return float(text)
    return text


def code_default(field: FieldInfo) -> Any:
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    if default is None or default == [] or default == frozenset():
        return "none"
    if isinstance(default, bool | str | frozenset):
        return default
    if isinstance(default, int | float):
        return float(default)
    return str(default)


def by_variable(fields: dict[str, FieldInfo]) -> dict[str, Any]:
    return {ENV_PREFIX + name.upper(): code_default(field) for name, field in fields.items()}


def test_every_process_setting_is_documented_with_its_default():
    documented = tables(CONFIGURATION.read_text(encoding="utf-8"))["Process settings"]
    process_only = {
        name: field
        for name, field in Settings.model_fields.items()
        if name not in Tuning.model_fields
    }

    assert {name: documented_default(cell) for name, cell in documented.items()} == by_variable(
        process_only
    )


def test_every_route_overridable_setting_is_documented_with_its_default():
    documented = tables(CONFIGURATION.read_text(encoding="utf-8"))[
        "Retry and repair settings (process-wide, and per route)"
    ]

    assert {name: documented_default(cell) for name, cell in documented.items()} == by_variable(
        Tuning.model_fields
    )


def test_every_route_key_is_documented_with_its_default():
    documented = tables(CONFIGURATION.read_text(encoding="utf-8"))["Routes"]
    keys = {
        field.alias or name: code_default(field)
        for name, field in RouteSpec.model_fields.items()
        if name not in INTERNAL_ROUTE_FIELDS
    }

    assert {name: documented_default(cell) for name, cell in documented.items()} == keys


def code_blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, flags=re.M | re.S)


def test_the_readme_first_screen_has_the_commands_an_agent_snippet_and_kubernetes():
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN_LINES])

    for command in README_COMMANDS:
        assert f"\n{command}\n" in first_screen
    [snippet] = code_blocks(first_screen, "python")
    assert len(snippet.splitlines()) <= 10
    assert "max_retries=0" in snippet
    assert "tool-retry-sidecar inject - --image" in first_screen


def quickstart() -> str:
    readme = README.read_text(encoding="utf-8")
    return next(block for block in code_blocks(readme, "sh") if "serve --upstream" in block)


def test_the_quickstart_waits_for_readiness_before_its_first_call():
    started = quickstart().index("tool-retry-sidecar serve")
    ready = quickstart().index("http://127.0.0.1:9464/readyz")
    first_call = quickstart().index("curl -i http://127.0.0.1:8090/")
    assert started < ready < first_call


def test_the_quickstart_wait_gives_up_in_bounded_time_and_says_so():
    # The wait as pasted (its continuation line joined), pointed at a port where nothing
    # listens, as when the sidecar failed to start; its bound shortened to keep this fast.
    lines = quickstart().replace("\\\n", "").splitlines()
    [wait] = [line for line in lines if "/readyz" in line]
    bound = int(re.search(r"--retry-max-time (\d+)", wait)[1])
    assert bound <= 30 and f"not ready after {bound} s" in wait
    script = wait.replace("127.0.0.1:9464", f"127.0.0.1:{unused_port()}").replace(
        f"--retry-max-time {bound}", "--retry-max-time 2"
    )
    assert shutil.which("curl"), "the Quickstart needs curl"

    started = time.monotonic()
    gave_up = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)

    assert time.monotonic() - started < 15
    assert gave_up.stdout == f"the sidecar is not ready after {bound} s: its lines above say why\n"


async def test_the_readme_agent_snippet_calls_a_tool_through_the_sidecar(make_tool, make_sidecar):
    async def weather(request: web.Request) -> web.Response:
        return web.json_response({"success": True, "data": {"temp_c": 21}})

    tool = await make_tool(weather)
    sidecar = await make_sidecar(tool)
    sidecar_url = str(sidecar.client.make_url("")).rstrip("/")
    snippet = code_blocks(README.read_text(encoding="utf-8"), "python")[0]
    printed: list[tuple[Any, ...]] = []
    namespace: dict[str, Any] = {"print": lambda *values: printed.append(values)}

    # The snippet's clients are synchronous: run it beside the loop that serves both.
    code = snippet.replace('"http://127.0.0.1:8090"', repr(sidecar_url))
    await asyncio.to_thread(exec, code, namespace)

    assert printed == [(200, "ok", {"success": True, "data": {"temp_c": 21}})]
    assert [(seen.method, seen.raw_path) for seen in tool.seen] == [("GET", "/weather.json")]
    client = namespace["client"]
    assert client.max_retries == 0
    assert str(client.base_url) == f"{sidecar_url}/v1/"


def test_every_metric_says_what_it_counts_and_when():
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    counted = tables(operations)["What each counts, and when"]
    registry = CollectorRegistry()
    Metrics(registry)
    families = {family.name for family in registry.collect() if family.name.startswith("sidecar_")}
    # prometheus-client names a counter's family without its _total.
    documented = {name.removesuffix("_total") for name in counted}

    assert documented == families


def test_the_tuning_page_is_linked_and_its_example_is_a_configuration_that_loads(
    tmp_path: Path, monkeypatch: Any
):
    tuning = (ROOT / "docs" / "tuning.md").read_text(encoding="utf-8")
    assert "(docs/tuning.md)" in README.read_text(encoding="utf-8")
    [example] = code_blocks(tuning, "yaml")
    (tmp_path / "sidecar.yaml").write_text(example)
    monkeypatch.setenv("SIDECAR_CONFIG_FILE", str(tmp_path / "sidecar.yaml"))

    routes = resolve_routes(load_settings())

    assert {route.name for route in routes} == {"reports", "search"}
    # The page's own rule: each route's retry window leaves room for a retry, and its
    # deadline for the window.
    for route in routes:
        assert route.tuning.retry_window_ms > 2 * route.tuning.per_try_timeout_ms
        assert route.tuning.request_timeout_ms >= route.tuning.retry_window_ms
