"""What a started sidecar holds in memory is mostly the modules it imported (docs/
performance.md, "Idle memory"): the packages only an optional feature uses are imported
when that feature is on, and a started app with the default configuration has none."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Packages only an optional feature uses.
OPTIONAL_PACKAGES = {
    "openai",
    "jsonschema",
    "redis",
    "opentelemetry",
    "yaml",
    "ruamel",
    "zstandard",
}

# Everything `serve` imports, then the proxy app and the admin app started and stopped:
# prints every module loaded.
STARTED_APP = """
import asyncio, sys
import sidecar.cli
from sidecar.config import load_settings
from sidecar.serve.app import create_admin_app, create_app, running

async def main():
    settings = load_settings(upstream_url="http://127.0.0.1:9").served()
    async with running(create_app(settings)) as app:
        create_admin_app(app)

asyncio.run(main())
print(" ".join(sorted(sys.modules)))
"""


def loaded_modules(environment: dict[str, str]) -> set[str]:
    clean = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SIDECAR_", "OTEL_", "OPENAI_"))
    }
    answer = subprocess.run(
        [sys.executable, "-c", STARTED_APP],
        env={**clean, **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert answer.returncode == 0, answer.stderr
    return set(answer.stdout.split())


def packages(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


# The repair layer's LLM modules (prompt, answer, scope, cache): only with a model.
LLM_LAYER = "sidecar.repair.llm"


def test_a_started_app_with_the_default_configuration_imports_no_optional_package():
    loaded = loaded_modules({})

    assert packages(loaded) & OPTIONAL_PACKAGES == set()
    assert LLM_LAYER not in loaded and "sidecar.repair.scope" not in loaded
    assert {"aiohttp", "prometheus_client", "sidecar.repair.pipeline"} <= loaded


@pytest.mark.parametrize(
    ("variable", "value", "package"),
    [
        ("SIDECAR_LLM_BASE_URL", "http://127.0.0.1:9/v1", "openai"),
        ("SIDECAR_STATE_URL", "redis://127.0.0.1:9", "redis"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9", "opentelemetry"),
    ],
)
def test_an_optional_package_is_imported_once_its_feature_is_on(variable, value, package):
    """The probe sees an import when there is one."""
    loaded = loaded_modules({variable: value})

    assert package in packages(loaded)
    assert (LLM_LAYER in loaded) is (package == "openai")
    assert "jsonschema" not in packages(loaded)
