"""Dashboards, alerts and chart values must speak of what the sidecar really exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from sidecar.observe import Metrics
from sidecar.settings import Settings

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
