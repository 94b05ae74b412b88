"""The settings a running sidecar serves with, as plain frozen records.

``load_settings`` validates the configuration with pydantic-settings; serving needs only
the values. pydantic, pydantic-settings and the models built on them hold about 7 MiB of
a started sidecar's 38 (docs/performance.md, "Idle memory"), so ``serve`` hands these
records to a fresh interpreter that never imports them (``serve.handoff``). Each field
has the name and the value of the model's field it copies (``Settings.served`` copies
them; tests/test_served_settings.py holds the two in step).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from yarl import URL

from sidecar.config.values import CircuitScope, JitterMode, RepairLevel, ReplayMode


class Secret:
    """A secret value that never shows in a repr or a log, as pydantic's ``SecretStr``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return (Secret, (self._value,))


# Each record is pickled as its class and its values in order: compiled with mypyc, a class
# with slots, frozen or not, cannot be unpickled by the default protocol.
_Reduced = tuple[type, tuple[Any, ...]]


def _reduced(record: Any) -> _Reduced:
    return (type(record), tuple(getattr(record, field.name) for field in fields(record)))


@dataclass(frozen=True, slots=True)
class ServedTuning:
    """A route's retry and repair settings (the model ``Tuning``'s fields)."""

    max_retries: int
    backoff_base_ms: int
    backoff_max_ms: int
    backoff_multiplier: float
    backoff_jitter: JitterMode
    max_retry_after_ms: int
    per_try_timeout_ms: int
    per_try_max_ms: int
    inspect_timeout_ms: int
    replay_delivered: ReplayMode
    retry_window_ms: int
    request_timeout_ms: int
    retry_on_status: frozenset[int]
    max_body_bytes: int
    retry_budget_ratio: float
    retry_budget_min_per_s: float
    circuit_failures: int
    circuit_min_calls: int
    circuit_failure_rate: float
    circuit_window_ms: int
    circuit_open_ms: int
    circuit_half_open_probes: int
    circuit_scope: CircuitScope
    hedge_after_ms: int
    host_rewrite: bool
    idempotency_header: str
    repair: RepairLevel
    llm_max_repairs: int

    def __reduce__(self) -> _Reduced:
        return _reduced(self)


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """A route ready to serve: its upstream parsed and its tuning resolved."""

    name: str
    prefix: str
    upstream: URL
    strip_prefix: bool
    schema_source: str | None
    tuning: ServedTuning
    idempotent: bool = False
    shared_state: bool = True

    def __reduce__(self) -> _Reduced:
        return _reduced(self)


@dataclass(frozen=True, slots=True)
class ServedSettings:
    """What ``serve`` reads of the process configuration (the model ``Settings``'s fields
    of the same names), its routes resolved."""

    host: str
    port: int
    admin_host: str
    admin_port: int
    admin_allowed_hosts: frozenset[str]
    ui: bool
    access_log: bool
    log_level: str
    log_format: str
    max_request_bytes: int
    max_in_flight: int
    client_timeout_ms: int
    max_header_bytes: int
    max_buffered_bytes: int
    upstream_max_connections: int
    drain_timeout_ms: int
    schema_refresh_ms: int
    llm_base_url: str | None
    llm_api_key: Secret | None
    llm_model: str
    llm_timeout_ms: int
    llm_max_concurrency: int
    llm_max_answer_tokens: int
    llm_max_answer_bytes: int
    state_url: Secret | None
    state_prefix: str
    state_timeout_ms: int
    route_configs: tuple[RouteConfig, ...]

    def __reduce__(self) -> _Reduced:
        return _reduced(self)
