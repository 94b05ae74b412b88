"""The configuration's models and the types of their values.

``Tuning`` holds every retry and repair setting; each may be set once for the process
and again per route. ``RouteSpec`` is a route as written, and ``Settings`` the whole
process configuration, which ``load_settings`` builds; ``Settings.served`` copies what
serving reads into plain records (``config.served``), routes resolved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from yarl import URL

from sidecar.config.served import RouteConfig, Secret, ServedSettings, ServedTuning
from sidecar.config.sources import settings_sources
from sidecar.config.values import CircuitScope, JitterMode, RepairLevel, ReplayMode

ENV_PREFIX = "SIDECAR_"
DEFAULT_ROUTE_NAME = "default"
STATE_SCHEMES = ("redis", "rediss", "valkey", "valkeys")

# The longest any duration setting may be: nothing the sidecar waits for or remembers
# should take longer, and it keeps every value within what asyncio's timers accept.
MAX_DURATION_MS = 24 * 60 * 60 * 1000


def _refuse_bool(value: Any) -> Any:
    # YAML reads true/yes/on as booleans, which pydantic would take for the number 1.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h)?")
_MS_PER_UNIT = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
DURATION_HELP = "must be a whole number of milliseconds, or a duration such as 200ms, 1.5s or 2m"


def _milliseconds(value: Any) -> Any:
    """A duration setting's value in whole milliseconds: a number is milliseconds already,
    a string may carry a unit (``200ms``, ``1.5s``, ``2m``, ``1h``). Booleans were refused
    before this runs; bounds are checked after it."""
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError(DURATION_HELP)
    if isinstance(value, str):
        found = _DURATION.fullmatch(value.strip().lower())
        if found and found[2] is None and "." not in found[1]:
            return int(found[1])  # exact, however large: the bound check names the limit
        if found:
            milliseconds = float(found[1]) * _MS_PER_UNIT[found[2] or "ms"]
            if milliseconds.is_integer():
                return int(milliseconds)
    raise ValueError(DURATION_HELP)


# The types of numeric settings: none takes a boolean, and each states its bounds.
_NOT_BOOL = BeforeValidator(_refuse_bool)
Count = Annotated[int, Field(ge=0), _NOT_BOOL]
Number = Annotated[float, Field(allow_inf_nan=False), _NOT_BOOL]
Port = Annotated[int, Field(ge=0, le=65535), _NOT_BOOL]
DurationMs = Annotated[
    int, Field(ge=0, le=MAX_DURATION_MS), BeforeValidator(_milliseconds), _NOT_BOOL
]


class Tuning(BaseModel):
    """Retry and repair settings: process-wide defaults, overridable per route."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The cap: the retry window, the backoff and the budget bound a request's retries first.
    # 10: at 30% independent faults an 8-call agent task needs 6 attempts a call to succeed
    # 99% of the time (0.3^6 x 8 = 0.6%), and 10 retries' worst backoffs (1.9 s) fit the 4 s
    # window; a tool that is down gets 3 (RETRIES_WHILE_UNPROVEN), as in 0.5.
    max_retries: Count = Field(10, le=100)
    # Envoy's own defaults (25 ms, ten times that): an agent's 5 s clock leaves no room
    # for second-long waits, and the deadline below caps whatever the waits add up to.
    backoff_base_ms: DurationMs = 25
    backoff_max_ms: DurationMs = 250
    backoff_multiplier: Number = Field(2.0, ge=1.0, le=100.0)
    backoff_jitter: JitterMode = "full"
    max_retry_after_ms: DurationMs = 60000
    per_try_timeout_ms: DurationMs = Field(30000, gt=0)
    # A call answered as an event stream lives past its per-try timeout while each event
    # shows it alive, up to this: the read timeout of the MCP Python SDK and pydantic-ai.
    per_try_max_ms: DurationMs = Field(300000, gt=0)
    inspect_timeout_ms: DurationMs = Field(2000, gt=0)
    replay_delivered: ReplayMode = "safe"
    # Retries end by 4 s: inside the 5 s timeout of openai-agents' MCP client and httpx,
    # with a second for the answer to reach the agent. A first attempt is not cut by it.
    retry_window_ms: DurationMs = Field(4000, gt=0)
    # The whole request: every attempt, the first included, and its waits and repairs.
    request_timeout_ms: DurationMs = Field(120000, gt=0)
    retry_on_status: Annotated[frozenset[Count], NoDecode] = frozenset({500, 502, 503, 504})
    max_body_bytes: Count = 10 * 1024 * 1024
    retry_budget_ratio: Number = Field(0.2, ge=0.0)
    retry_budget_min_per_s: Number = Field(10.0, ge=0.0)
    circuit_failures: Count = 5
    circuit_min_calls: Count = 20
    circuit_failure_rate: Number = Field(0.5, gt=0.0, le=1.0)
    circuit_window_ms: DurationMs = Field(30000, gt=0)
    circuit_open_ms: DurationMs = Field(30000, gt=0)
    circuit_half_open_probes: Count = Field(3, ge=1)
    circuit_scope: CircuitScope = "tool"
    hedge_after_ms: DurationMs = 0
    # False: the agent's ``Host`` reaches the tool, as Envoy keeps it, so a tool's own
    # DNS-rebinding check sees what the agent sent; true: the upstream's address, for a
    # tool behind a name-based virtual host (a CDN, an ingress).
    host_rewrite: bool = False
    idempotency_header: str = "Idempotency-Key"
    repair: RepairLevel = "auto"
    llm_max_repairs: Count = 2

    @field_validator("retry_on_status", mode="before")
    @classmethod
    def _split_statuses(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, int):
            return [value]
        return value

    @field_validator("retry_on_status")
    @classmethod
    def _statuses_in_range(cls, value: frozenset[int]) -> frozenset[int]:
        for status in value:
            if not 100 <= status <= 599:
                raise ValueError(f"{status} is not an HTTP status code")
        return value

    @field_validator("repair", "idempotency_header", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML reads an unquoted ``off`` as false; in these two settings it is the word.
        return "off" if value is False else value

    @field_validator("repair", "backoff_jitter", "circuit_scope", mode="before")
    @classmethod
    def _lowercase_word(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("idempotency_header")
    @classmethod
    def _header_token(cls, value: str) -> str:
        if value.strip().lower() == "off":
            return ""
        if value and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", value):
            raise ValueError("must be a header name, off or empty")
        return value

    @model_validator(mode="after")
    def _backoff_cap_covers_base(self) -> Tuning:
        if "backoff_max_ms" not in self.model_fields_set:
            # Envoy's rule: unset, the cap is ten times the base (250 ms by default), so a
            # configuration that sets only the base keeps working.
            capped = min(10 * self.backoff_base_ms, MAX_DURATION_MS)
            object.__setattr__(self, "backoff_max_ms", capped)
        elif self.backoff_max_ms < self.backoff_base_ms:
            raise ValueError("backoff_max_ms must be at least backoff_base_ms")
        return self


TUNING_FIELDS = frozenset(Tuning.model_fields)


class RouteSpec(BaseModel):
    """A route as written in the YAML file: where a path prefix goes, plus overrides."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    prefix: str = "/"
    upstream: AnyHttpUrl
    strip_prefix: bool = False
    idempotent: bool = False  # every call of this route is safe to run twice
    shared_state: bool = True  # false: this route keeps its state to this process
    schema_source: str | None = Field(None, alias="schema")
    overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_overrides(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "overrides" in data:
            raise ValueError("overrides is not a route key: write each setting on the route")
        own = {k: v for k, v in data.items() if k not in TUNING_FIELDS}
        overrides = {k: v for k, v in data.items() if k in TUNING_FIELDS}
        return {**own, "overrides": overrides}

    @field_validator("prefix")
    @classmethod
    def _normalise_prefix(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        if "?" in value or "#" in value:
            raise ValueError("must be a path without query or fragment")
        return value.rstrip("/") or "/"


class Settings(Tuning, BaseSettings):
    """The process configuration. Build it with ``load_settings``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        extra="forbid",
        frozen=True,
        populate_by_name=True,
    )

    # Loopback by default: the proxy relays to the tools for anyone who reaches it and the
    # admin port has no authentication. A container sets what it needs (the image, the
    # chart, the compose files and ``inject`` do).
    host: str = "127.0.0.1"
    port: Port = 8090
    # Apart from ``host`` so the proxy can stay on loopback while probes and scrapes reach
    # the admin port from the pod network.
    admin_host: str = "127.0.0.1"
    admin_port: Port = 9464
    # Host names the admin port answers besides IP literals and ``localhost`` (DNS rebinding).
    admin_allowed_hosts: Annotated[frozenset[str], NoDecode] = frozenset()
    upstream_url: AnyHttpUrl | None = None
    config_file: Path | None = None
    routes: list[RouteSpec] = Field(default_factory=list)
    upstream_max_connections: Count = 1000
    max_in_flight: Count = 2048
    client_timeout_ms: DurationMs = Field(60000, gt=0)
    max_request_bytes: Count = 1024 * 1024 * 1024
    # Heads, bodies and answers held in memory, together: a quarter of the chart's 256 MiB
    # limit, leaving the rest to the process (~56 MiB), the LLM client and the copies a
    # held byte costs on its way through.
    max_buffered_bytes: Count = 64 * 1024 * 1024
    # A request's or an answer's head: Envoy's default is 60 KiB, aiohttp's 8 KiB a line.
    max_header_bytes: Count = Field(64 * 1024, ge=1024)
    drain_timeout_ms: DurationMs = 20000
    schema_refresh_ms: DurationMs = Field(300000, ge=1000)
    llm_base_url: AnyHttpUrl | None = None
    llm_api_key: SecretStr | None = None
    llm_model: str = "gpt-4o-mini"
    llm_timeout_ms: DurationMs = Field(10000, gt=0)
    llm_max_concurrency: Count = Field(4, ge=1)
    # What is read and inflated of one answer of the model's endpoint; a repair holds one.
    llm_max_answer_bytes: Count = Field(1024 * 1024, ge=1024)
    # The most ``max_tokens`` a call asks for; less for a small payload (``llm_format``).
    llm_max_answer_tokens: Count = Field(4096, ge=64)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    access_log: bool = False
    # The live page on the admin port (``GET /ui``); off, the admin port answers 404 there.
    ui: bool = True
    # Fleet state: unset keeps every guard in this process.
    state_url: SecretStr | None = None
    state_prefix: str = "sidecar:"
    state_timeout_ms: DurationMs = Field(25, gt=0)

    @field_validator("admin_allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple | set | frozenset):
            return [str(part).strip().lower() for part in value if str(part).strip()]
        return value

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("state_url")
    @classmethod
    def _state_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            scheme = URL(value.get_secret_value()).scheme
            if scheme not in STATE_SCHEMES:
                raise ValueError(f"must start with {', '.join(s + '://' for s in STATE_SCHEMES)}")
        return value

    @model_validator(mode="after")
    def _ports_differ(self) -> Settings:
        # One port on two different addresses is fine, but a wildcard address takes them all.
        hosts = {self.host, self.admin_host}
        shared = len(hosts) == 1 or bool(hosts & {"0.0.0.0", "::", ""})
        if self.port and self.port == self.admin_port and shared:
            raise ValueError(
                f"port (SIDECAR_PORT) and admin_port (SIDECAR_ADMIN_PORT) are both {self.port}: "
                "the proxy and the admin endpoints need a port each"
            )
        return self

    @model_validator(mode="after")
    def _routes_are_coherent(self) -> Settings:
        specs = self.all_route_specs()
        if not specs:
            raise ValueError("no upstream: set SIDECAR_UPSTREAM_URL or routes in the config file")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError("route names must be unique")
        prefixes = [spec.prefix for spec in specs]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("route prefixes must be unique")
        return self

    def old_deadline_setting(self) -> bool:
        """Whether ``request_timeout_ms`` is set (for the process or a route) with no
        ``retry_window_ms`` beside it: 0.5 read it as the window of the retries, which
        ``retry_window_ms`` is now; it is the whole request's deadline since 0.6."""
        routes = [spec.overrides for spec in self.routes]
        return any(
            "request_timeout_ms" in fields and "retry_window_ms" not in fields
            for fields in (self.model_fields_set, *routes)
        )

    def all_route_specs(self) -> list[RouteSpec]:
        """The file's routes plus the ``default`` route made from ``upstream_url``."""
        specs = list(self.routes)
        if self.upstream_url is not None:
            specs.append(
                RouteSpec.model_validate(
                    {"name": DEFAULT_ROUTE_NAME, "upstream": self.upstream_url}
                )
            )
        return specs

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return settings_sources(settings_cls, init_settings, env_settings)

    @cached_property
    def route_configs(self) -> tuple[RouteConfig, ...]:
        """Every route ready to serve, resolved once: the settings are frozen."""
        # Imported here: resolving words its errors with these models' field names, so
        # the routes module builds on this one.
        from sidecar.config.routes import resolve_routes

        return resolve_routes(self)

    def served(self) -> ServedSettings:
        """The values ``serve`` reads, as plain records: the served process needs no
        pydantic (``config.served`` says why)."""
        names = {field.name for field in fields(ServedSettings)} - {"route_configs"}
        values: dict[str, Any] = {name: getattr(self, name) for name in names}
        values["llm_base_url"] = str(self.llm_base_url) if self.llm_base_url else None
        for secret in ("llm_api_key", "state_url"):
            value = values[secret]
            values[secret] = Secret(value.get_secret_value()) if value is not None else None
        return ServedSettings(**values, route_configs=self.route_configs)


def served_tuning(tuning: Tuning) -> ServedTuning:
    """A route's tuning as the plain record it is served with."""
    return ServedTuning(**{name: getattr(tuning, name) for name in TUNING_FIELDS})
