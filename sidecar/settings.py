"""Configuration: environment (prefix ``SIDECAR_``) over a YAML file over defaults.

``Tuning`` holds every retry and repair setting; each may be set once for the process
and again per route. ``Settings`` is the whole process configuration. ``load_settings``
is the single entry point and turns every validation problem into a one-line
``ConfigError`` that names the field and never echoes a value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
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

ENV_PREFIX = "SIDECAR_"
DEFAULT_ROUTE_NAME = "default"

JitterMode = Literal["full", "equal", "decorrelated", "none"]
RepairLevel = Literal["off", "deterministic", "auto"]
ReplayMode = Literal["safe", "always"]
REPAIR_LEVELS: tuple[RepairLevel, ...] = ("off", "deterministic", "auto")


class ConfigError(Exception):
    """A configuration problem, stated in one line that is safe to print."""


class Tuning(BaseModel):
    """Retry and repair settings: process-wide defaults, overridable per route."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_retries: int = Field(3, ge=0, le=100)
    backoff_base_ms: int = Field(1000, ge=0)
    backoff_max_ms: int = Field(10000, ge=0)
    backoff_multiplier: float = Field(2.0, ge=1.0, le=100.0)
    backoff_jitter: JitterMode = "full"
    max_retry_after_ms: int = Field(60000, ge=0)
    per_try_timeout_ms: int = Field(30000, gt=0)
    inspect_timeout_ms: int = Field(2000, gt=0)
    replay_delivered: ReplayMode = "safe"
    request_timeout_ms: int = Field(120000, gt=0)
    retry_on_status: Annotated[frozenset[int], NoDecode] = frozenset({500, 502, 503, 504})
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=0)
    retry_budget_ratio: float = Field(0.2, ge=0.0)
    retry_budget_min_per_s: float = Field(10.0, ge=0.0)
    circuit_failures: int = Field(5, ge=0)
    circuit_failure_rate: float = Field(0.5, gt=0.0, le=1.0)
    circuit_window_ms: int = Field(30000, gt=0)
    circuit_open_ms: int = Field(30000, gt=0)
    circuit_half_open_probes: int = Field(3, ge=1)
    idempotency_header: str = "Idempotency-Key"
    repair: RepairLevel = "auto"
    llm_max_repairs: int = Field(2, ge=0)

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

    @field_validator("idempotency_header")
    @classmethod
    def _header_token(cls, value: str) -> str:
        if value.strip().lower() == "off":
            return ""
        if value and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", value):
            raise ValueError("must be a header name or empty")
        return value

    @model_validator(mode="after")
    def _backoff_cap_covers_base(self) -> Tuning:
        if self.backoff_max_ms < self.backoff_base_ms:
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
    schema_source: str | None = Field(None, alias="schema")
    overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_overrides(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        own = {k: v for k, v in data.items() if k not in TUNING_FIELDS}
        overrides = {k: v for k, v in data.items() if k in TUNING_FIELDS}
        return {**own, "overrides": {**own.get("overrides", {}), **overrides}}

    @field_validator("prefix")
    @classmethod
    def _normalise_prefix(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        if "?" in value or "#" in value:
            raise ValueError("must be a path without query or fragment")
        return value.rstrip("/") or "/"


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """A route ready to serve: its upstream parsed and its tuning resolved."""

    name: str
    prefix: str
    upstream: URL
    strip_prefix: bool
    schema_source: str | None
    tuning: Tuning
    idempotent: bool = False


class Settings(Tuning, BaseSettings):
    """The process configuration. Build it with ``load_settings``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        extra="forbid",
        frozen=True,
        populate_by_name=True,
    )

    host: str = "0.0.0.0"
    port: int = Field(8090, ge=0, le=65535)
    # Apart from ``host`` so the proxy can stay on loopback while probes and scrapes reach
    # the admin port from the pod network.
    admin_host: str = "0.0.0.0"
    admin_port: int = Field(9464, ge=0, le=65535)
    upstream_url: AnyHttpUrl | None = None
    config_file: Path | None = None
    routes: list[RouteSpec] = Field(default_factory=list)
    upstream_max_connections: int = Field(1000, ge=0)
    max_in_flight: int = Field(2048, ge=0)
    client_timeout_ms: int = Field(60000, gt=0)
    max_request_bytes: int = Field(1024 * 1024 * 1024, ge=0)
    drain_timeout_ms: int = Field(20000, ge=0)
    schema_refresh_ms: int = Field(300000, ge=1000)
    llm_base_url: AnyHttpUrl | None = None
    llm_api_key: SecretStr | None = None
    llm_model: str = "gpt-4o-mini"
    llm_timeout_ms: int = Field(10000, gt=0)
    llm_max_concurrency: int = Field(4, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    access_log: bool = False

    @field_validator("log_level", "log_format", "repair", "backoff_jitter", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

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

    def all_route_specs(self) -> list[RouteSpec]:
        """The file's routes plus the ``default`` route made from ``upstream_url``."""
        specs = list(self.routes)
        if self.upstream_url is not None:
            specs.append(RouteSpec(name=DEFAULT_ROUTE_NAME, upstream=self.upstream_url))
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
        return (
            init_settings,
            env_settings,
            _ForeignEnvSource(settings_cls),
            _YamlFileSource(settings_cls, init_settings, env_settings),
        )


class _ForeignEnvSource(PydanticBaseSettingsSource):
    """Names other tools use for the same settings, below the ``SIDECAR_`` ones."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = os.environ
        values: dict[str, Any] = {}
        if "GOMIND_AGENT_MAX_RETRIES" in env:
            values["max_retries"] = env["GOMIND_AGENT_MAX_RETRIES"]
        if "GOMIND_AGENT_RETRY_BACKOFF_MS" in env:
            values["backoff_base_ms"] = env["GOMIND_AGENT_RETRY_BACKOFF_MS"]
        use_ai = env.get("GOMIND_AGENT_USE_AI_CORRECTION", "").strip().lower()
        if use_ai in ("false", "0", "no", "off"):
            values["repair"] = "deterministic"
        if "OPENAI_BASE_URL" in env:
            values["llm_base_url"] = env["OPENAI_BASE_URL"]
        if "OPENAI_API_KEY" in env:
            values["llm_api_key"] = env["OPENAI_API_KEY"]
        return values


class _YamlFileSource(PydanticBaseSettingsSource):
    """The YAML file named by ``--config`` or ``SIDECAR_CONFIG_FILE``."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
    ) -> None:
        super().__init__(settings_cls)
        self._path = init_settings().get("config_file") or env_settings().get("config_file")

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not self._path:
            return {}
        path = Path(self._path)
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"config_file: cannot read {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config_file: {path} is not valid YAML{where}") from None
        if document is None:
            return {}
        if not isinstance(document, dict):
            raise ConfigError(f"config_file: {path} must hold a mapping of settings")
        return {key: value for key, value in document.items() if key != "config_file"}


def load_settings(**overrides: Any) -> Settings:
    """Settings from keyword overrides (the CLI flags), the environment and the file."""
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    resolve_routes(settings)
    return settings


def resolve_routes(settings: Settings) -> tuple[RouteConfig, ...]:
    """Every route with its process defaults merged under its own overrides."""
    defaults = settings.model_dump(include=set(TUNING_FIELDS))
    routes = []
    for index, spec in enumerate(settings.all_route_specs()):
        try:
            tuning = Tuning.model_validate({**defaults, **spec.overrides})
        except ValidationError as exc:
            raise ConfigError(_describe(exc, f"routes[{index}] ({spec.name}).")) from None
        routes.append(
            RouteConfig(
                name=spec.name,
                prefix=spec.prefix,
                upstream=URL(str(spec.upstream)),
                strip_prefix=spec.strip_prefix,
                schema_source=spec.schema_source,
                tuning=tuning,
                idempotent=spec.idempotent,
            )
        )
    return tuple(routes)


def _describe(exc: ValidationError, prefix: str = "") -> str:
    """One line naming each failing field and why; input values are never shown."""
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(part) for part in error["loc"] if part != "overrides")
        message = error["msg"].removeprefix("Value error, ")
        if not loc:
            problems.append(message)
        elif prefix or "." in loc or not loc.isidentifier():
            problems.append(f"{prefix}{loc}: {message}")
        else:
            problems.append(f"{loc} ({ENV_PREFIX}{loc.upper()}): {message}")
    return "configuration error: " + "; ".join(problems)


def masked(settings: Settings) -> dict[str, Any]:
    """The effective configuration as plain data, with every secret masked."""
    data = settings.model_dump(mode="json", by_alias=True, exclude={"routes", "upstream_url"})
    data["llm_api_key"] = "***" if settings.llm_api_key else None
    data["retry_on_status"] = _plain(settings.retry_on_status)
    data["routes"] = [
        {
            "name": route.name,
            "prefix": route.prefix,
            "upstream": _mask_url(route.upstream),
            "strip_prefix": route.strip_prefix,
            "schema": route.schema_source,
            **{key: _plain(getattr(route.tuning, key)) for key in spec.overrides},
        }
        for spec, route in zip(settings.all_route_specs(), resolve_routes(settings), strict=True)
    ]
    if settings.llm_base_url is not None:
        data["llm_base_url"] = _mask_url(URL(str(settings.llm_base_url)))
    return data


def _plain(value: Any) -> Any:
    return sorted(value) if isinstance(value, frozenset) else value


def _mask_url(url: URL) -> str:
    if url.password is not None or url.user is not None:
        url = url.with_user("***").with_password(None)
    if url.query:
        url = url.with_query({key: "***" for key in url.query})
    return str(url)
