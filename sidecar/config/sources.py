"""Where settings come from, in order: the command line's flags, the ``SIDECAR_``
environment, the names other tools use for the same settings, the YAML file, then the
defaults. ``Settings`` reads its sources from ``settings_sources``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from sidecar.config.errors import ConfigError

# Variables other tools use for the same settings, read below the ``SIDECAR_`` ones.
FOREIGN_VARIABLES = {
    "GOMIND_AGENT_MAX_RETRIES": "max_retries",
    "GOMIND_AGENT_RETRY_BACKOFF_MS": "backoff_base_ms",
    "OPENAI_BASE_URL": "llm_base_url",
    "OPENAI_API_KEY": "llm_api_key",
}


def settings_sources(
    settings_cls: type[BaseSettings],
    init_settings: PydanticBaseSettingsSource,
    env_settings: PydanticBaseSettingsSource,
) -> tuple[PydanticBaseSettingsSource, ...]:
    """The sources of ``settings_cls``, the first one holding a setting winning."""
    return (
        init_settings,
        env_settings,
        _ForeignEnvSource(settings_cls),
        _YamlFileSource(settings_cls, init_settings, env_settings),
    )


class _ForeignEnvSource(PydanticBaseSettingsSource):
    """Names other tools use for the same settings, below the ``SIDECAR_`` ones."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = os.environ
        values: dict[str, Any] = {
            field: env[name] for name, field in FOREIGN_VARIABLES.items() if name in env
        }
        use_ai = env.get("GOMIND_AGENT_USE_AI_CORRECTION", "").strip().lower()
        if use_ai in ("false", "0", "no", "off"):
            values["repair"] = "deterministic"
        return values


class _YamlFileSource(PydanticBaseSettingsSource):
    """The YAML file named by ``--config`` or ``SIDECAR_CONFIG_FILE``."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
    ) -> None:
        super().__init__(settings_cls)
        self._path = init_settings().get("config_file") or env_settings().get("config_file")

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not self._path:
            return {}
        import yaml  # only a config file needs it

        path = Path(self._path)
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"config_file: cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config_file: {path} is not UTF-8 text (byte {exc.start + 1})"
            ) from None
        except RecursionError:
            raise ConfigError(f"config_file: {path} nests too deeply") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config_file: {path} is not valid YAML{where}") from None
        if document is None:
            return {}
        if not isinstance(document, dict):
            raise ConfigError(f"config_file: {path} must hold a mapping of settings")
        for key in document:
            if not isinstance(key, str):
                raise ConfigError(
                    f"config_file: {path} has a key that is not a setting name ({key!r:.40})"
                )
        return {key: value for key, value in document.items() if key != "config_file"}
