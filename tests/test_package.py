"""What a newcomer sees of the installed package: its metadata and its --help."""

from __future__ import annotations

from importlib.metadata import metadata
from pathlib import Path

from tests.processes import run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_the_distribution_says_what_it_is_and_for_which_pythons():
    meta = metadata("tool-retry-sidecar")
    classifiers = meta.get_all("Classifier") or []

    assert meta["Summary"].startswith("A reverse proxy beside an AI agent")
    assert meta["License"] == "Apache-2.0"
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert "Topic :: Internet :: Proxy Servers" in classifiers
    assert "sidecar" in (meta["Keywords"] or "")


def test_help_names_check_config_and_the_documentation_it_points_to():
    result = run_cli("--help")

    assert result.returncode == 0
    assert "tool-retry-sidecar check-config" in result.stdout
    named = {word.rstrip(",.") for word in result.stdout.split() if word.endswith((".md", ".md,"))}
    assert {"README.md", "docs/configuration.md", "docs/tuning.md"} <= named
    for page in named:
        assert (ROOT / page).is_file(), page
