"""Command line: ``serve`` (the default) and ``check-config``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from sidecar import __version__
from sidecar.observe import configure_logging
from sidecar.server import serve
from sidecar.settings import ConfigError, Settings, load_settings, masked

EXIT_CONFIG_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tool-retry-sidecar",
        description="A reverse proxy beside an AI agent that retries, waits for and "
        "repairs failed HTTP tool calls. Configured by SIDECAR_* environment variables.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        upstream_url=getattr(args, "upstream", None),
        port=getattr(args, "port", None),
        admin_port=getattr(args, "admin_port", None),
        config_file=getattr(args, "config", None),
    )


def _run(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(settings))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(settings))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if args.command == "check-config":
        print(json.dumps(masked(settings), indent=2, sort_keys=True))
        return 0
    _run(settings)
    return 0
