"""The effective configuration as ``check-config`` prints it, every secret masked.

What counts as secret in a URL is ``sidecar.credentials``'s rule; this module picks the
settings that hold secrets and lays out the routes.
"""

from __future__ import annotations

from typing import Any

from yarl import URL

from sidecar.config.model import Settings
from sidecar.credentials import MASK, mask_url


def masked(settings: Settings) -> dict[str, Any]:
    """The effective configuration as plain data, with every secret masked."""
    data = settings.model_dump(mode="json", by_alias=True, exclude={"routes", "upstream_url"})
    data["llm_api_key"] = MASK if settings.llm_api_key else None
    if settings.state_url is not None:
        data["state_url"] = mask_url(URL(settings.state_url.get_secret_value()))
    data["retry_on_status"] = _plain(settings.retry_on_status)
    data["routes"] = [
        {
            "name": route.name,
            "prefix": route.prefix,
            "upstream": mask_url(route.upstream),
            "strip_prefix": route.strip_prefix,
            "schema": route.schema_source,
            **{key: _plain(getattr(route.tuning, key)) for key in spec.overrides},
        }
        for spec, route in zip(settings.all_route_specs(), settings.route_configs, strict=True)
    ]
    if settings.llm_base_url is not None:
        data["llm_base_url"] = mask_url(URL(str(settings.llm_base_url)))
    return data


def _plain(value: Any) -> Any:
    return sorted(value) if isinstance(value, frozenset) else value
