"""Route resolution: each route's own settings merged over the process defaults.

``Settings.route_configs`` calls this once per settings object; ``load_settings`` asks
for it, so a bad route fails at load.
"""

from __future__ import annotations

from pydantic import ValidationError
from yarl import URL

from sidecar.config.errors import ConfigError
from sidecar.config.messages import describe
from sidecar.config.model import TUNING_FIELDS, Settings, Tuning, served_tuning
from sidecar.config.served import RouteConfig


def resolve_routes(settings: Settings) -> tuple[RouteConfig, ...]:
    """Every route with its process defaults merged under its own overrides."""
    # A cap the settings did not set follows each route's own base (ten times it).
    unset_cap = {"backoff_max_ms"} - settings.model_fields_set
    defaults = settings.model_dump(include=set(TUNING_FIELDS - unset_cap))
    routes = []
    for index, spec in enumerate(settings.all_route_specs()):
        try:
            tuning = Tuning.model_validate({**defaults, **spec.overrides})
        except ValidationError as exc:
            raise ConfigError(describe(exc, f"routes[{index}] ({spec.name}).")) from None
        routes.append(
            RouteConfig(
                name=spec.name,
                prefix=spec.prefix,
                upstream=URL(str(spec.upstream)),
                strip_prefix=spec.strip_prefix,
                schema_source=spec.schema_source,
                tuning=served_tuning(tuning),
                idempotent=spec.idempotent,
                shared_state=spec.shared_state,
            )
        )
    return tuple(routes)
