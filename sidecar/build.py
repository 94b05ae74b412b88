"""Which build of the package this is: the hot path compiled with mypyc, or pure Python.

A wheel built with ``SIDECAR_COMPILE=1`` holds an extension module beside each module of
``COMPILED_MODULES`` (setup.py compiles exactly these); Python's import system prefers the
extension to the ``.py`` beside it, so the choice is made at import with no setting, and a
pure install simply has no extensions. ``--version`` and ``sidecar_build_info`` report what
the import system finds here, never what the build meant to do.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

# The variable the build reads (build_backend/compile_choice.py): exported in a shell that
# also serves, it is no mistyped setting.
BUILD_SETTING = "SIDECAR_COMPILE"

# The modules on a request's path whose compiled form pays: the transport (with the wire
# beneath it and the agent's side), the agent-facing server and the retry package took
# 90k, 59k and 71k instructions off a request's 916k,
# and the streamed bodies' iterators, the cancellation watch and the guards 58k more; the
# four of tool/, outcomes and credentials none (docs/performance.md). Not compiled either:
# the telemetry events and sinks, whose handlers telemetry.contract checks by their
# annotations, which compiled functions do not carry.
COMPILED_MODULES: tuple[str, ...] = (
    "sidecar.retry.attempt",
    "sidecar.retry.call",
    "sidecar.retry.cancel",
    "sidecar.retry.classify",
    "sidecar.retry.controls",
    "sidecar.retry.decide",
    "sidecar.retry.engine",
    "sidecar.retry.guards.budget",
    "sidecar.retry.guards.circuit",
    "sidecar.retry.guards.route",
    "sidecar.retry.guards.tools",
    "sidecar.retry.guards.window",
    "sidecar.retry.machine",
    "sidecar.retry.policy",
    "sidecar.retry.replay",
    "sidecar.retry.steps",
    "sidecar.retry.waits",
    "sidecar.serve.agentwire",
    "sidecar.serve.answers",
    "sidecar.serve.httpserver",
    "sidecar.serve.intake",
    "sidecar.serve.proxy",
    "sidecar.serve.relay",
    "sidecar.transport.answer",
    "sidecar.transport.connection",
    "sidecar.transport.exchange",
    "sidecar.transport.pool",
    "sidecar.wire.body",
    "sidecar.wire.buffers",
    "sidecar.wire.grammar",
    "sidecar.wire.headers",
)


def compiled_modules(names: tuple[str, ...] = COMPILED_MODULES) -> tuple[str, ...]:
    """Those of ``names`` that import from an extension module, as the import system finds
    them (it loads none of them to say so)."""
    return tuple(name for name in names if _is_extension(name))


def _is_extension(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)


def is_compiled() -> bool:
    """Whether this build runs any compiled module (the build-info metric's label)."""
    return bool(compiled_modules())


def describe() -> str:
    """``compiled: N modules`` or ``pure Python``, for ``--version``."""
    compiled = compiled_modules()
    return f"compiled: {len(compiled)} modules" if compiled else "pure Python"
