"""``serve`` continued in a fresh interpreter that holds only what serving needs.

Loading and validating the configuration takes pydantic and pydantic-settings: some
7 MiB of a started sidecar's private memory that serving never reads again, and a module
once imported cannot be unloaded (docs/performance.md, "Idle memory"). So once the
settings are valid, ``serve`` replaces its own process with a new interpreter (``exec``:
the same PID, so signals, the exit code and a container's view of it are unchanged),
handing it the served records (``config.served``) through an anonymous in-memory file
(``memfd_create``: nothing on a file system, and only this process holds it). Where
there is no such file (not Linux, or refused), the same process serves.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import sidecar
from sidecar.config.errors import ConfigError
from sidecar.config.served import ServedSettings
from sidecar.telemetry.logging_setup import configure_logging

# Bad configuration, or a start that cannot succeed as configured (a port in use).
EXIT_CANNOT_START = 2

_T = TypeVar("_T")


def hand_off(settings: ServedSettings) -> None:
    """Continue as a fresh interpreter that serves ``settings``. Returns only where that
    cannot be done, for the caller to serve in this process."""
    if not hasattr(os, "memfd_create") or not sys.executable:
        return
    try:  # a seccomp profile may refuse memfd_create; exec fails only before it replaces us
        handed = os.memfd_create("sidecar-settings", 0)  # no MFD_CLOEXEC: the new image reads it
    except OSError:
        return
    with open(handed, "wb", closefd=False) as written:
        pickle.dump(settings, written)
    os.lseek(handed, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, interpreter_line(handed))
    except OSError:
        os.close(handed)


def interpreter_line(handed: int) -> list[str]:
    """This interpreter's command line, with its ``-O``, ``-W`` and ``-X`` options, running
    ``continue_serving`` from this same copy of the package; the command's own arguments
    follow, unused, so that ``ps`` and ``pgrep -f`` still show what was started."""
    root = str(Path(sidecar.__file__).resolve().parent.parent)
    code = (
        f"import sys; sys.path.insert(0, {root!r}); from sidecar.serve.handoff import "
        f"continue_serving; sys.exit(continue_serving({handed}))"
    )
    options = [
        f"-X{name}" if value is True else f"-X{name}={value}"
        for name, value in sys._xoptions.items()
    ]
    warnings = [f"-W{option}" for option in sys.warnoptions]
    optimize = ["-" + "O" * sys.flags.optimize] if sys.flags.optimize else []
    return [sys.executable, *optimize, *warnings, *options, "-c", code, *sys.argv]


def continue_serving(handed: int) -> int:
    """The fresh interpreter: the settings ``hand_off`` wrote, served."""
    with open(handed, "rb") as written:
        settings = pickle.load(written)
    if not isinstance(settings, ServedSettings):
        raise TypeError(f"not served settings: {type(settings).__name__}")
    configure_logging(settings.log_level, settings.log_format)
    return serve_until_stopped(settings)


def serve_until_stopped(settings: ServedSettings) -> int:
    """Serve until SIGTERM/SIGINT; the exit code, or ``EXIT_CANNOT_START`` with the reason
    on stderr."""
    # Imported here: the process that only validates and hands off never serves.
    from sidecar.serve.server import StartupError, serve

    try:
        run_loop(serve(settings))
    except (StartupError, ConfigError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_CANNOT_START
    return 0


def run_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
