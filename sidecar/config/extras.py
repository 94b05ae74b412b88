"""Optional extras: what each needs importable, and the one line that says how to get it.

An extra is loaded only when the configuration asks for what it provides, so a plain
``pip install tool-retry-sidecar`` stays small. Whatever asks for one checks here first,
at start-up and in ``check-config``: a missing extra is a configuration error (one line,
exit code 2), never a ``ModuleNotFoundError`` once serving has begun.
"""

from __future__ import annotations

import importlib.util

from sidecar.config.errors import ConfigError

DISTRIBUTION = "tool-retry-sidecar"

# Every module the sidecar imports from each extra (pyproject.toml lists its packages).
EXTRAS: dict[str, tuple[str, ...]] = {
    "otel": (
        "opentelemetry.trace",
        "opentelemetry.sdk.trace",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    ),
}


def require_extra(extra: str, wanted_by: str) -> None:
    """Raise a one-line ``ConfigError`` when a module of ``extra`` cannot be imported.

    ``wanted_by`` says what in the configuration asked for the extra.
    """
    if not all(_importable(module) for module in EXTRAS[extra]):
        raise ConfigError(
            f"configuration error: {wanted_by} needs the {extra} extra, which is not "
            f"installed: pip install '{DISTRIBUTION}[{extra}]'"
        )


def _importable(module: str) -> bool:
    # find_spec imports the parent packages; a missing parent raises instead of
    # returning None.
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False
