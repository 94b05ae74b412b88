"""``load_settings``, the single way to build the settings: every problem on the way
becomes one ``ConfigError`` line that names the field and never echoes a value.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from sidecar.config.errors import ConfigError
from sidecar.config.messages import describe
from sidecar.config.model import Settings


def load_settings(**overrides: Any) -> Settings:
    """Settings from keyword overrides (the CLI flags), the environment and the file."""
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(describe(exc, given=overrides)) from None
    except SettingsError as exc:
        # Says which variable could not be parsed (SIDECAR_ROUTES is JSON), not its value.
        raise ConfigError(f"configuration error: {exc}") from None
    except RecursionError:
        raise ConfigError("configuration error: a value nests too deeply") from None
    # Resolved now, so a bad route override fails at load; everything after reuses these.
    settings.route_configs  # noqa: B018
    return settings
