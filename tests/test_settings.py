"""Configuration: the contract's names and defaults, precedence, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import (
    ConfigError,
    load_settings,
    masked,
    resolve_routes,
    unknown_variables,
)

UPSTREAM = "http://127.0.0.1:8080"


def test_defaults_are_the_contracts():
    settings = load_settings(upstream_url=UPSTREAM)

    assert (settings.host, settings.port, settings.admin_port) == ("127.0.0.1", 8090, 9464)
    assert settings.admin_host == "127.0.0.1"
    assert settings.max_retries == 10  # a cap: the window and the budget bound retries first
    assert (settings.backoff_base_ms, settings.backoff_max_ms) == (25, 250)
    assert settings.backoff_multiplier == 2.0
    assert settings.backoff_jitter == "full"
    assert settings.max_retry_after_ms == 60000
    assert (settings.per_try_timeout_ms, settings.request_timeout_ms) == (30000, 120000)
    assert settings.retry_window_ms == 4000
    assert settings.retry_on_status == {500, 502, 503, 504}
    assert settings.upstream_max_connections == 1000
    assert settings.max_body_bytes == 10485760
    assert (settings.retry_budget_ratio, settings.retry_budget_min_per_s) == (0.2, 10)
    assert (settings.circuit_failures, settings.circuit_open_ms) == (5, 30000)
    assert settings.circuit_min_calls == 20
    assert settings.idempotency_header == "Idempotency-Key"
    assert settings.repair == "auto"
    assert settings.llm_model == "gpt-4o-mini"
    assert (settings.llm_timeout_ms, settings.llm_max_repairs) == (10000, 2)
    assert settings.llm_max_concurrency == 4
    assert (settings.log_level, settings.log_format) == ("info", "json")
    [route] = resolve_routes(settings)
    assert (route.name, route.prefix, str(route.upstream)) == ("default", "/", UPSTREAM + "/")


def test_environment_sets_every_field(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SIDECAR_UPSTREAM_URL", UPSTREAM)
    monkeypatch.setenv("SIDECAR_MAX_RETRIES", "5")
    monkeypatch.setenv("SIDECAR_RETRY_ON_STATUS", "502, 503")
    monkeypatch.setenv("SIDECAR_BACKOFF_JITTER", "Decorrelated")
    monkeypatch.setenv("SIDECAR_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("SIDECAR_ACCESS_LOG", "true")

    settings = load_settings()

    assert settings.max_retries == 5
    assert settings.retry_on_status == {502, 503}
    assert settings.backoff_jitter == "decorrelated"
    assert settings.log_level == "debug"
    assert settings.access_log is True


def test_an_unset_backoff_cap_is_ten_times_the_base_of_the_process_or_route(
    monkeypatch: pytest.MonkeyPatch,
):
    """Envoy's rule: a configuration from before 0.5 that sets only the base (1 s, or
    GoMind's alias) keeps a cap above it; a cap that is set is kept, and checked."""
    monkeypatch.setenv("SIDECAR_BACKOFF_BASE_MS", "1000")
    monkeypatch.setenv(
        "SIDECAR_ROUTES",
        '[{"name": "a", "prefix": "/a", "upstream": "http://a"},'
        ' {"name": "b", "prefix": "/b", "upstream": "http://b", "backoff_base_ms": 2000},'
        ' {"name": "c", "prefix": "/c", "upstream": "http://c", "backoff_max_ms": 1500}]',
    )
    settings = load_settings()
    a, b, c = resolve_routes(settings)

    assert settings.backoff_max_ms == 10000
    assert (a.tuning.backoff_max_ms, b.tuning.backoff_max_ms, c.tuning.backoff_max_ms) == (
        10000,
        20000,
        1500,
    )
    with pytest.raises(ConfigError, match="backoff_max_ms must be at least backoff_base_ms"):
        load_settings(backoff_max_ms=500)


def test_file_then_environment_then_flags_and_route_values_win_for_their_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        """
max_retries: 7
backoff_base_ms: 200
retry_on_status: [502, 503]
routes:
  - name: weather
    prefix: /weather/
    upstream: http://weather-tool:8080
    strip_prefix: true
    schema: ./openapi.json
    max_retries: 1
  - name: search
    prefix: /search
    upstream: http://search-tool:8080
"""
    )
    monkeypatch.setenv("SIDECAR_CONFIG_FILE", str(config))
    monkeypatch.setenv("SIDECAR_BACKOFF_BASE_MS", "300")

    settings = load_settings(port=9999)
    weather, search = resolve_routes(settings)

    assert settings.port == 9999
    assert settings.backoff_base_ms == 300  # env over file
    assert settings.retry_on_status == {502, 503}
    assert (weather.prefix, weather.strip_prefix, weather.schema_source) == (
        "/weather",
        True,
        "./openapi.json",
    )
    assert weather.tuning.max_retries == 1
    assert weather.tuning.backoff_base_ms == 300
    assert search.tuning.max_retries == 7


def test_durations_in_the_file_take_a_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        """
backoff_base_ms: 200ms
per_try_timeout_ms: 1.5s
request_timeout_ms: 2m
backoff_max_ms: 5000
routes:
  - name: slow
    prefix: /slow
    upstream: http://slow-tool:8080
    per_try_timeout_ms: 1h
"""
    )
    monkeypatch.setenv("SIDECAR_CONFIG_FILE", str(config))
    monkeypatch.setenv("SIDECAR_CLIENT_TIMEOUT_MS", "45s")

    settings = load_settings()
    [slow] = resolve_routes(settings)

    assert (settings.backoff_base_ms, settings.per_try_timeout_ms) == (200, 1500)
    assert (settings.request_timeout_ms, settings.backoff_max_ms) == (120000, 5000)
    assert settings.client_timeout_ms == 45000
    assert slow.tuning.per_try_timeout_ms == 3600000


@pytest.mark.parametrize("written", ["200 msec", "2d", "1.5", "0.5ms", "fast"])
def test_a_duration_without_a_known_unit_names_the_file_key_and_milliseconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
):
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"backoff_base_ms: {written}\n")
    monkeypatch.setenv("SIDECAR_CONFIG_FILE", str(config))

    with pytest.raises(ConfigError) as raised:
        load_settings(upstream_url=UPSTREAM)

    # The value came from the file: the key is named as written there, not as a variable.
    assert str(raised.value) == (
        "configuration error: backoff_base_ms in the config file: must be a whole number of "
        "milliseconds, or a duration such as 200ms, 1.5s or 2m"
    )


def test_a_bad_duration_in_the_environment_names_its_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SIDECAR_BACKOFF_BASE_MS", "soon")

    with pytest.raises(ConfigError, match=r"backoff_base_ms \(SIDECAR_BACKOFF_BASE_MS\): must"):
        load_settings(upstream_url=UPSTREAM)


def test_gomind_names_are_aliases_below_sidecar_names(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GOMIND_AGENT_MAX_RETRIES", "6")
    monkeypatch.setenv("GOMIND_AGENT_RETRY_BACKOFF_MS", "250")
    monkeypatch.setenv("GOMIND_AGENT_USE_AI_CORRECTION", "false")

    aliased = load_settings(upstream_url=UPSTREAM)
    assert (aliased.max_retries, aliased.backoff_base_ms, aliased.repair) == (
        6,
        250,
        "deterministic",
    )

    monkeypatch.setenv("SIDECAR_MAX_RETRIES", "2")
    assert load_settings(upstream_url=UPSTREAM).max_retries == 2


def test_openai_variables_configure_the_llm(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-openai-var")

    settings = load_settings(upstream_url=UPSTREAM)

    assert str(settings.llm_base_url) == "http://127.0.0.1:1/v1"
    assert settings.llm_api_key is not None
    assert settings.llm_api_key.get_secret_value() == "sk-from-openai-var"


@pytest.mark.parametrize(
    ("env", "file", "expected"),
    [
        ({"SIDECAR_MAX_RETRIES": "-1"}, None, "max_retries (SIDECAR_MAX_RETRIES): "),
        ({"SIDECAR_BACKOFF_JITTER": "sometimes"}, None, "backoff_jitter (SIDECAR_BACKOFF_JITTER)"),
        ({"SIDECAR_RETRY_ON_STATUS": "503,abc"}, None, "retry_on_status"),
        ({"SIDECAR_RETRY_ON_STATUS": "503,700"}, None, "700 is not an HTTP status code"),
        ({"SIDECAR_UPSTREAM_URL": "ftp://tool"}, None, "upstream_url (SIDECAR_UPSTREAM_URL)"),
        ({"SIDECAR_UPSTREAM_URL": ""}, None, "no upstream"),
        (
            {},
            "routes: [{name: a, upstream: 'http://a'}, {name: a, upstream: 'http://b', prefix: /b}]",  # noqa: E501
            "route names must be unique",
        ),
        (
            {},
            "routes: [{name: a, upstream: 'http://a', max_retries: lots}]",
            "routes[0] (a).max_retries",
        ),
        (
            {},
            "routes: [{name: a, upstream: 'http://a', prefix: nope}]",
            "routes.0.prefix: must start with '/'",
        ),
        (
            {},
            "routes: [{name: a, upstream: 'http://a', colour: red}]",
            "routes.0.colour is not a route setting",
        ),
        ({}, "max_retrys: 3\nupstream_url: http://a", "max_retrys"),
        ({}, "- just\n- a list", "must hold a mapping"),
        ({}, "key: [unclosed", "is not valid YAML at line"),
    ],
)
def test_bad_configuration_is_one_line_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict, file: str | None, expected: str
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if "SIDECAR_UPSTREAM_URL" not in env and file is None:
        monkeypatch.setenv("SIDECAR_UPSTREAM_URL", UPSTREAM)
    if file is not None:
        (tmp_path / "c.yaml").write_text(file)
        monkeypatch.setenv("SIDECAR_CONFIG_FILE", str(tmp_path / "c.yaml"))

    with pytest.raises(ConfigError) as raised:
        load_settings()

    message = str(raised.value)
    assert message.startswith("configuration error") or message.startswith("config_file:")
    assert expected in message
    assert "\n" not in message


def test_missing_config_file_is_named():
    with pytest.raises(ConfigError, match=r"config_file: cannot read /nonexistent.yaml"):
        load_settings(config_file="/nonexistent.yaml")


def test_errors_and_masked_output_never_show_secrets(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SIDECAR_LLM_BASE_URL", "not-a-url-sk-secret-in-url")
    with pytest.raises(ConfigError) as raised:
        load_settings(upstream_url=UPSTREAM)
    assert "sk-secret" not in str(raised.value)

    monkeypatch.setenv("SIDECAR_LLM_BASE_URL", "http://llm.local/v1?key=sk-query-secret")
    monkeypatch.setenv("SIDECAR_LLM_API_KEY", "sk-api-secret")
    settings = load_settings(upstream_url="http://user:pa55word@tool.local:8080/base?token=t0k")
    shown = repr(masked(settings))

    for secret in ("sk-query-secret", "sk-api-secret", "pa55word", "t0k"):
        assert secret not in shown
    assert "tool.local:8080/base" in shown


def test_yaml_off_means_off_for_repair_and_the_idempotency_header(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "repair: off\nidempotency_header: off\n"
        "routes: [{name: a, prefix: /a, upstream: 'http://a', repair: off}]\n"
    )

    settings = load_settings(upstream_url=UPSTREAM, config_file=str(config))

    assert (settings.repair, settings.idempotency_header) == ("off", "")
    assert resolve_routes(settings)[0].tuning.repair == "off"


def test_the_word_off_disables_the_idempotency_header(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SIDECAR_IDEMPOTENCY_HEADER", "OFF")
    assert load_settings(upstream_url=UPSTREAM).idempotency_header == ""


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("SIDECAR_REQUEST_TIMEOUT_MS", str(24 * 3600 * 1000), True),
        ("SIDECAR_REQUEST_TIMEOUT_MS", str(24 * 3600 * 1000 + 1), False),
        ("SIDECAR_CIRCUIT_OPEN_MS", str(2**64), False),
        ("SIDECAR_SCHEMA_REFRESH_MS", "1e30", False),
        ("SIDECAR_RETRY_BUDGET_RATIO", "inf", False),
        ("SIDECAR_RETRY_BUDGET_MIN_PER_S", "nan", False),
        ("SIDECAR_PORT", "true", False),
    ],
)
def test_durations_are_at_most_a_day_and_numbers_are_finite(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, accepted: bool
):
    monkeypatch.setenv(name, value)
    if accepted:
        load_settings(upstream_url=UPSTREAM)
    else:
        with pytest.raises(ConfigError, match=name):
            load_settings(upstream_url=UPSTREAM)


def test_both_ports_may_be_chosen_by_the_system():
    settings = load_settings(upstream_url=UPSTREAM, port=0, admin_port=0)
    assert (settings.port, settings.admin_port) == (0, 0)


def test_one_port_serves_both_only_on_two_different_addresses(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SIDECAR_PORT", "8090")
    monkeypatch.setenv("SIDECAR_ADMIN_PORT", "8090")
    monkeypatch.setenv("SIDECAR_HOST", "127.0.0.1")
    with pytest.raises(ConfigError, match="are both 8090"):
        load_settings(upstream_url=UPSTREAM)  # the admin host is every address

    monkeypatch.setenv("SIDECAR_ADMIN_HOST", "10.0.0.7")
    assert load_settings(upstream_url=UPSTREAM).admin_port == 8090


def test_unknown_variables_name_the_setting_they_most_likely_meant():
    environ = {
        "SIDECAR_MAX_RETRYS": "5",
        "sidecar_log_levl": "debug",
        "SIDECAR_PORT": "1",
        "SIDECAR_QQQ": "1",
        "OTHER_MAX_RETRYS": "1",
        "SIDECAR_COMPILE": "1",  # the build's, not a setting
    }

    assert [(unknown.name, unknown.suggestion) for unknown in unknown_variables(environ)] == [
        ("SIDECAR_MAX_RETRYS", "SIDECAR_MAX_RETRIES"),
        ("SIDECAR_QQQ", None),
        ("sidecar_log_levl", "SIDECAR_LOG_LEVEL"),
    ]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("SIDECAR_RETRYS", "SIDECAR_MAX_RETRIES"),
        ("SIDECAR_RETRIES", "SIDECAR_MAX_RETRIES"),
        ("SIDECAR_BACKOFF_BASE", "SIDECAR_BACKOFF_BASE_MS"),
        ("SIDECAR_UPSTREAM", "SIDECAR_UPSTREAM_URL"),
        ("SIDECAR_RETRY_BUDGET", "SIDECAR_RETRY_BUDGET_RATIO"),
        ("SIDECAR_LLM_KEY", "SIDECAR_LLM_API_KEY"),
        ("SIDECAR_ACCES_LOG", "SIDECAR_ACCESS_LOG"),
        ("SIDECAR_CIRCUIT_FAILURE", "SIDECAR_CIRCUIT_FAILURES"),
        ("SIDECAR_STATUS_RETRY", None),
    ],
)
def test_an_unknown_variable_is_compared_with_every_setting_by_its_words(typed, meant):
    # Not only near-misses of a whole name: a name that is part of a setting's name, or
    # one word of it mistyped, gets a suggestion too.
    [unknown] = unknown_variables({typed: "3"})
    assert unknown.suggestion == meant


@pytest.mark.parametrize(
    ("variables", "warned"),
    [
        ({}, False),
        ({"SIDECAR_REQUEST_TIMEOUT_MS": "500"}, True),  # 0.5 read it as the retry window
        ({"SIDECAR_REQUEST_TIMEOUT_MS": "500", "SIDECAR_RETRY_WINDOW_MS": "400"}, False),
        ({"SIDECAR_RETRY_WINDOW_MS": "400"}, False),
    ],
)
def test_a_deadline_set_the_0_5_way_is_named_at_start(monkeypatch, variables, warned):
    monkeypatch.setenv("SIDECAR_UPSTREAM_URL", UPSTREAM)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert load_settings().old_deadline_setting() is warned
