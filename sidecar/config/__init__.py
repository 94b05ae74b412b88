"""Configuration: the settings' models, where they come from, and how they are shown.

The public names are importable from here (``from sidecar.config import load_settings``)
but loaded on first use: importing ``sidecar.config.values``, as the pure retry modules
do, runs this file first, and must not load pydantic-settings and the loader with it.

- ``values``: the words a setting may take (plain ``Literal`` types)
- ``errors``: ``ConfigError``
- ``model``: ``Tuning``, ``RouteSpec``, ``RouteConfig``, ``Settings``
- ``sources``: flags, environment, other tools' variables, the YAML file
- ``messages``: the one-line messages, and the names a reader most likely meant
- ``routes``: each route's settings merged over the process defaults
- ``served``: ``ServedSettings``, ``ServedTuning``, ``RouteConfig``: what ``serve`` reads, as
  plain records
- ``loader``: ``load_settings``
- ``display``: the masked configuration ``check-config`` prints
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.config.display import masked as masked
    from sidecar.config.errors import ConfigError as ConfigError
    from sidecar.config.loader import load_settings as load_settings
    from sidecar.config.messages import UnknownVariable as UnknownVariable
    from sidecar.config.messages import unknown_variables as unknown_variables
    from sidecar.config.model import DEFAULT_ROUTE_NAME as DEFAULT_ROUTE_NAME
    from sidecar.config.model import ENV_PREFIX as ENV_PREFIX
    from sidecar.config.model import TUNING_FIELDS as TUNING_FIELDS
    from sidecar.config.model import RouteSpec as RouteSpec
    from sidecar.config.model import Settings as Settings
    from sidecar.config.model import Tuning as Tuning
    from sidecar.config.routes import resolve_routes as resolve_routes
    from sidecar.config.served import RouteConfig as RouteConfig
    from sidecar.config.served import ServedSettings as ServedSettings
    from sidecar.config.served import ServedTuning as ServedTuning
    from sidecar.config.values import REPAIR_LEVELS as REPAIR_LEVELS
    from sidecar.config.values import CircuitScope as CircuitScope
    from sidecar.config.values import JitterMode as JitterMode
    from sidecar.config.values import RepairLevel as RepairLevel
    from sidecar.config.values import ReplayMode as ReplayMode

# Each public name and the module that owns it.
_HOMES = {
    "masked": "display",
    "ConfigError": "errors",
    "load_settings": "loader",
    "UnknownVariable": "messages",
    "unknown_variables": "messages",
    "DEFAULT_ROUTE_NAME": "model",
    "ENV_PREFIX": "model",
    "TUNING_FIELDS": "model",
    "RouteConfig": "served",
    "ServedSettings": "served",
    "ServedTuning": "served",
    "RouteSpec": "model",
    "Settings": "model",
    "Tuning": "model",
    "resolve_routes": "routes",
    "REPAIR_LEVELS": "values",
    "CircuitScope": "values",
    "JitterMode": "values",
    "RepairLevel": "values",
    "ReplayMode": "values",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
