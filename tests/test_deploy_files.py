"""Dashboards, alerts and chart values must speak of what the sidecar really exposes."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from sidecar.config import RouteSpec, Settings
from sidecar.inject.args import CONFIG_KEY
from sidecar.inject.container import ADMIN_PORT_NAME, CONFIG_DIR
from sidecar.inject.pod import INJECTED_LABEL
from sidecar.telemetry.metric_definitions import Metrics

ROOT = Path(__file__).resolve().parent.parent
METRIC = re.compile(r"\b(?:sidecar|process)_[a-z_]+")


def exposed_series() -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry)
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def test_dashboard_queries_use_only_exposed_metrics_and_cover_them_all():
    dashboard = json.loads((ROOT / "deploy/grafana/dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in METRIC.findall(expr)}

    assert used <= exposed_series()
    # Every family of the sidecar's own is charted; of the standard process ones, a few.
    families = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for name in exposed_series()
        if name.startswith("sidecar_")
    }
    assert {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in used} >= families
    assert {"process_resident_memory_bytes", "process_open_fds"} <= used


def test_alert_rules_use_only_exposed_metrics():
    rules = yaml.safe_load((ROOT / "helm/tool-retry-sidecar/files/alerts.yaml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = {name for expr in exprs for name in METRIC.findall(expr)}

    assert used and used <= exposed_series()
    assert (ROOT / "deploy/prometheus/alerts.yaml").resolve() == (
        ROOT / "helm/tool-retry-sidecar/files/alerts.yaml"
    )


def test_chart_and_compose_settings_are_real_settings():
    values = yaml.safe_load((ROOT / "helm/tool-retry-sidecar/values.yaml").read_text())
    compose_settings = yaml.safe_load((ROOT / "deploy/sidecar.yaml").read_text())

    assert set(values["sidecar"]["settings"]) <= set(Settings.model_fields)
    assert set(compose_settings) <= set(Settings.model_fields)


def test_every_container_says_where_the_sidecar_listens():
    # The sidecar defaults to loopback; each way of running it in a container sets both
    # addresses itself rather than inherit whatever the image or the default says.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "SIDECAR_HOST=0.0.0.0" in dockerfile and "SIDECAR_ADMIN_HOST=0.0.0.0" in dockerfile
    for name in ("docker-compose.yml", "docker-compose.fleet.yml"):
        services = yaml.safe_load((ROOT / "deploy" / name).read_text())["services"]
        sidecars = [
            s for s in services.values() if "SIDECAR_UPSTREAM_URL" in s.get("environment", {})
        ]
        assert sidecars, name
        for service in sidecars:
            assert service["environment"]["SIDECAR_HOST"] == "0.0.0.0", name
            assert "SIDECAR_ADMIN_HOST" in service["environment"], name
    helpers = (ROOT / "helm/tool-retry-sidecar/templates/_helpers.tpl").read_text()
    assert "{name: SIDECAR_HOST, value: {{ .Values.sidecar.host | quote }}}" in helpers
    assert '{name: SIDECAR_ADMIN_HOST, value: "0.0.0.0"}' in helpers
    values = yaml.safe_load((ROOT / "helm/tool-retry-sidecar/values.yaml").read_text())
    assert values["sidecar"]["host"] == "127.0.0.1"


def unknown_keys(given: Any, defaults: Any, path: str = "") -> list[str]:
    """Keys of ``given`` that ``defaults`` lacks; Helm ignores such a key without a word."""
    if not isinstance(given, dict) or not isinstance(defaults, dict) or not defaults:
        return []
    unknown = []
    for key, value in given.items():
        if key not in defaults:
            unknown.append(path + key)
        else:
            unknown += unknown_keys(value, defaults[key], f"{path}{key}.")
    return unknown


def test_agent_only_values_are_values_the_chart_reads():
    chart = ROOT / "helm/tool-retry-sidecar"
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    own = yaml.safe_load((chart / "values-own-agent.yaml").read_text())

    assert own["example"]["enabled"] is False
    assert unknown_keys(own, defaults) == []
    assert unknown_keys({"sidecar": {"typo": 1}}, defaults) == ["sidecar.typo"]
    assert set(own["sidecar"]["settings"]) <= set(Settings.model_fields)
    for route in own["sidecar"]["routes"]:
        RouteSpec.model_validate(route)


def test_the_chart_selects_scrapes_and_mounts_what_inject_adds():
    templates = ROOT / "helm/tool-retry-sidecar/templates"
    helpers = (templates / "_helpers.tpl").read_text()

    assert f'{INJECTED_LABEL}: "true"' in helpers
    assert f"name: {ADMIN_PORT_NAME}, containerPort" in helpers
    assert f"SIDECAR_CONFIG_FILE, value: {CONFIG_DIR}/{CONFIG_KEY}" in helpers
    assert f"  {CONFIG_KEY}: |" in (templates / "configmap.yaml").read_text()
    for monitor in ("podmonitor.yaml", "servicemonitor.yaml"):
        assert f"- port: {ADMIN_PORT_NAME}" in (templates / monitor).read_text()


def test_the_image_builds_the_compiled_wheel_from_everything_the_build_reads():
    # No Docker engine runs in CI: what the build stage copies, and what the context lets
    # through, are checked here against what the build backend reads.
    dockerfile = (ROOT / "Dockerfile").read_text()
    build_stage, final_stage = dockerfile.split("\nFROM ", 2)[1:]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "sidecar"}
    needed |= set(pyproject["build-system"]["backend-path"])
    copied = {
        source.rstrip("/")
        for line in build_stage.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    }
    assert needed <= copied, needed - copied
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert needed <= allowed, needed - allowed
    assert "SIDECAR_COMPILE=1 pip wheel" in build_stage
    assert "gcc" in build_stage and "gcc" not in final_stage
