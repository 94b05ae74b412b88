"""/metrics exposes the contract's families exactly as prometheus_client's own metrics did
(names, types, HELP, labels, buckets, the order of series, exemplars), now that the
request path counts in plain numbers (``telemetry.metric_series``).

``metrics_exposition.prom`` is the table of expected families: the text exposition of
``metrics_scenario`` as prometheus_client's own ``Counter``, ``Histogram`` and ``Gauge``
objects wrote it, the process and platform families left out.
"""

from __future__ import annotations

import time
from pathlib import Path

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from sidecar.serve.app import create_admin_app
from sidecar.telemetry.metric_series import GaugeSeries, HistogramSeries
from tests.conftest import BUILD_UNDER_TEST
from tests.metrics_scenario import EXEMPLAR, scenario_registry

# The build-info line names the build the suite runs on (tests/conftest.py checks which).
EXPECTED = (
    (Path(__file__).parent / "metrics_exposition.prom")
    .read_text()
    .replace(
        'compiled="{compiled}"',
        f'compiled="{"true" if BUILD_UNDER_TEST == "compiled" else "false"}"',
    )
)


def sidecar_lines(text: str) -> str:
    """The exposition's lines of the sidecar's own families."""
    kept = []
    for line in text.splitlines(keepends=True):
        name = line.split()[2] if line.startswith("# ") else line
        if name.startswith("sidecar_"):
            kept.append(line)
    return "".join(kept)


def test_the_scenario_is_exposed_byte_for_byte_as_before():
    text = generate_latest(scenario_registry()).decode()

    assert sidecar_lines(text) == EXPECTED


def test_every_family_of_the_contract_is_in_the_expected_table():
    families = {family.name: family.type for family in text_string_to_metric_families(EXPECTED)}

    assert families == {
        "sidecar_build_info": "gauge",
        "sidecar_requests": "counter",
        "sidecar_request_duration_seconds": "histogram",
        "sidecar_upstream_attempts": "counter",
        "sidecar_upstream_duration_seconds": "histogram",
        "sidecar_in_flight_requests": "gauge",
        "sidecar_buffered_bytes": "gauge",
        "sidecar_event_loop_lag_seconds": "gauge",
        "sidecar_retries": "counter",
        "sidecar_retry_wait_seconds": "histogram",
        "sidecar_retry_budget_exhausted": "counter",
        "sidecar_mcp_sessions_reopened": "counter",
        "sidecar_repairs": "counter",
        "sidecar_llm_requests": "counter",
        "sidecar_llm_response_format": "counter",
        "sidecar_llm_duration_seconds": "histogram",
        "sidecar_llm_tokens": "counter",
        "sidecar_state_errors": "counter",
        "sidecar_circuit_state": "gauge",
        "sidecar_hedges": "counter",
    }


def test_openmetrics_carries_each_buckets_latest_exemplar_with_its_time():
    before = time.time()
    text = openmetrics.generate_latest(scenario_registry()).decode()
    after = time.time()

    exemplars = [
        (sample.name, sample.labels, sample.exemplar)
        for family in parse_om(text)
        for sample in family.samples
        if sample.exemplar is not None
    ]
    assert [
        (name, labels, exemplar.labels, exemplar.value) for name, labels, exemplar in exemplars
    ] == [
        (
            "sidecar_request_duration_seconds_bucket",
            {"route": "sampled", "outcome": "ok", "le": "0.25"},
            EXEMPLAR,
            0.25,
        ),
        (
            "sidecar_upstream_duration_seconds_bucket",
            {"route": "sampled", "le": "0.25"},
            EXEMPLAR,
            0.2,
        ),
    ]
    assert all(before <= float(exemplar.timestamp) <= after for _, _, exemplar in exemplars)


def test_a_bucket_keeps_the_latest_exemplar_and_counts_every_observation():
    histogram = HistogramSeries("h_seconds", "h", (1, 2))

    histogram.observe((), 0.5, {"trace_id": "a"})
    histogram.observe((), 1.0, {"trace_id": "b"})
    histogram.observe((), 0.7)
    histogram.observe((), 3.0)

    [one, two, inf, count, total] = histogram.family().samples
    assert [(s.labels["le"], s.value) for s in (one, two, inf)] == [
        ("1.0", 3.0),
        ("2.0", 3.0),
        ("+Inf", 4.0),
    ]
    assert one.exemplar is not None and one.exemplar.labels == {"trace_id": "b"}
    assert two.exemplar is None and inf.exemplar is None
    assert (count.value, total.value) == (4.0, 5.2)


def test_a_gauge_read_at_scrape_time_reports_its_source_then():
    held = [0]
    gauge = GaugeSeries("held_bytes", "held", read=lambda: held[0])
    held[0] = 4096

    [sample] = gauge.family().samples

    assert sample.value == 4096.0


async def test_metrics_served_after_real_requests_have_the_expected_families(
    make_tool, make_sidecar, aiohttp_client
):
    answers = iter([web.json_response({"error": "busy"}, status=503)])

    async def busy_once(_: web.Request) -> web.Response:
        return next(answers, None) or web.json_response({"success": True})

    sidecar = await make_sidecar(await make_tool(busy_once))
    admin = await aiohttp_client(create_admin_app(sidecar.app))
    for _ in range(2):
        await (await sidecar.client.post("/a", json={})).read()

    text = await (await admin.get("/metrics")).text()

    served = {
        family.name: (family.type, family.documentation)
        for family in text_string_to_metric_families(sidecar_lines(text))
    }
    expected = {
        family.name: (family.type, family.documentation)
        for family in text_string_to_metric_families(EXPECTED)
    }
    assert served == expected
    assert 'sidecar_requests_total{method="POST",outcome="recovered",route="default"} 1.0' in text
    assert 'sidecar_requests_total{method="POST",outcome="ok",route="default"} 1.0' in text
    assert 'sidecar_retries_total{reason="server_error",route="default"} 1.0' in text
    assert 'sidecar_request_duration_seconds_count{outcome="ok",route="default"} 1.0' in text
    assert 'sidecar_in_flight_requests{route="default"} 0.0' in text
