"""The ``inject`` subcommand's arguments, apart from the transform itself.

Every start of the sidecar builds the whole command line; the transform's YAML machinery
is loaded only when ``inject`` runs.
"""

from __future__ import annotations

from typing import Any

from sidecar import __version__

# The ConfigMap key (and file name) the sidecar's YAML config is mounted under.
CONFIG_KEY = "sidecar.yaml"
DEFAULT_IMAGE = f"tool-retry-sidecar:{__version__}"


def add_parser(commands: Any) -> None:
    """The ``inject`` subcommand's arguments."""
    description = (
        "Add the sidecar to every pod template in Kubernetes YAML (a file, or - for standard "
        "input) and write the result to standard output: "
        "tool-retry-sidecar inject deploy.yaml | kubectl apply -f -"
    )
    parser = commands.add_parser(
        "inject", help="add the sidecar to Kubernetes manifests", description=description
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="manifests to read; - (the default) reads standard input",
    )
    parser.add_argument(
        "--uninject", action="store_true", help="take out everything inject added instead"
    )
    # In this order in --help: the sidecar, then the agents beside it, then the ports.
    _add_sidecar_arguments(parser)
    _add_agent_arguments(parser)
    parser.add_argument("--port", type=int, default=8090, metavar="N", help="proxy port")
    parser.add_argument("--admin-port", type=int, default=9464, metavar="N", help="admin port")


def _add_sidecar_arguments(parser: Any) -> None:
    """What the sidecar runs: its image, its kind of container, its tool, config and key."""
    parser.add_argument(
        "--image", default=DEFAULT_IMAGE, help=f"the sidecar's image (default {DEFAULT_IMAGE})"
    )
    parser.add_argument(
        "--no-native",
        dest="native",
        action="store_false",
        help="a plain container instead of a native sidecar (Kubernetes < 1.29)",
    )
    parser.add_argument("--upstream", metavar="URL", help="the tool the sidecar fronts")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        metavar="FILE",
        help="the sidecar's YAML config (routes, settings): emitted as a ConfigMap and mounted",
    )
    source.add_argument(
        "--config-map",
        metavar="NAME",
        help=f"an existing ConfigMap whose key {CONFIG_KEY} is the config",
    )
    parser.add_argument(
        "--llm-secret", metavar="NAME/KEY", help="the Secret and key holding the LLM API key"
    )


def _add_agent_arguments(parser: Any) -> None:
    """Which agent containers are pointed at the sidecar, and through which variables."""
    parser.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="NAME[=PATH]",
        help="set this variable of the agent containers to the sidecar's URL (plus PATH, a "
        "route's prefix; repeatable); without PATH its old value is the default upstream",
    )
    parser.add_argument(
        "--agent-container",
        action="append",
        default=[],
        metavar="NAME",
        help="the agent container (repeatable; default: every container)",
    )
