"""Command line: ``serve`` (the default), ``demo``, ``check-config`` and ``inject``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import structlog

from sidecar import __version__, build
from sidecar.config import ConfigError, Settings, load_settings, masked, unknown_variables
from sidecar.inject import args as inject_args
from sidecar.serve.handoff import EXIT_CANNOT_START, hand_off, run_loop, serve_until_stopped
from sidecar.telemetry.logging_setup import configure_logging
from sidecar.telemetry.otel import tracing_exporters

# Where a newcomer goes from --help: the check before serving, and the documentation.
EPILOG = """\
Before serving, check a configuration (environment, --config file) and see what it
resolves to, secrets masked:
  tool-retry-sidecar check-config [--config FILE]

Documentation, in the project's repository: README.md (start here),
docs/configuration.md (every setting), docs/tuning.md (backoff and timeouts),
docs/operations.md (metrics, logs, start-up errors), docs/kubernetes.md (inject)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tool-retry-sidecar",
        description="A reverse proxy beside an AI agent that retries, waits for and "
        "repairs failed HTTP tool calls. Configured by SIDECAR_* environment variables.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    version = f"%(prog)s {__version__} ({build.describe()})"
    parser.add_argument("--version", action="version", version=version)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in (
        ("serve", "run the sidecar (the default)"),
        ("check-config", "validate the configuration and print it with secrets masked"),
    ):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--upstream", metavar="URL", help="the default route's upstream")
        command.add_argument("--port", type=int, metavar="N", help="proxy port")
        command.add_argument("--admin-port", type=int, metavar="N", help="admin port")
        command.add_argument("--config", metavar="FILE", help="YAML file with routes and settings")
    demo = commands.add_parser(
        "demo",
        help="show every recovery path against a bundled flaky tool",
        description="Start a bundled flaky weather tool and a sidecar in front of it on "
        "loopback, play a scripted agent through each failure, and print what happened.",
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the tool and the sidecar up afterwards and print curl lines to try",
    )
    inject_args.add_parser(commands)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        upstream_url=getattr(args, "upstream", None),
        port=getattr(args, "port", None),
        admin_port=getattr(args, "admin_port", None),
        config_file=getattr(args, "config", None),
    )


def _with_default_command(argv: Sequence[str]) -> list[str]:
    """``serve`` is the default command, also when only its flags are given."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        return ["serve", *argv]
    return list(argv)


def _print_to_reader(text: str) -> None:
    """Print ``text``; a reader that leaves early (``| head``) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _reader_left()


def _reader_left() -> None:
    """Python flushes stdout again at exit; point it at nothing so that stays quiet."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(_with_default_command(sys.argv[1:] if argv is None else argv))
    # Each command loads only what it needs: the served process stays small.
    if args.command == "inject":
        from sidecar.inject import transform as inject

        return inject.run(args)
    if args.command == "demo":
        from sidecar.demo.run import DEMO_SETTINGS, run_demo

        configure_logging(str(DEMO_SETTINGS["log_level"]), "console")
        try:
            return run_loop(run_demo(sys.stdout, keep_running=args.keep_running))
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return EXIT_CANNOT_START
        except BrokenPipeError:
            _reader_left()  # ``demo | head``: the reader has what it wanted
            return 0
    try:
        settings = _settings(args)
        # Tracing is configured by the standard OTEL_* variables, checked here as well.
        tracing_exporters(os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CANNOT_START
    ignored = unknown_variables(os.environ)
    if args.command == "check-config":
        for variable in ignored:
            print(f"warning: {variable}", file=sys.stderr)
        # The configuration is valid even when the reader stops early: still exit 0.
        _print_to_reader(json.dumps(masked(settings), indent=2, sort_keys=True))
        return 0
    configure_logging(settings.log_level, settings.log_format)
    log = structlog.get_logger("sidecar")
    for variable in ignored:
        log.warning("unknown_variable", variable=variable.name, reason=str(variable))
    if settings.old_deadline_setting():
        log.warning(
            "setting_meaning_changed",
            setting="request_timeout_ms",
            reason="since 0.6 SIDECAR_REQUEST_TIMEOUT_MS is the whole request's deadline and "
            "cuts a first attempt too; 0.5's meaning, the window of a request's retries, is "
            "SIDECAR_RETRY_WINDOW_MS (default 4 s)",
        )
    served = settings.served()
    hand_off(served)  # on Linux, this process continues as a fresh interpreter
    return serve_until_stopped(served)
