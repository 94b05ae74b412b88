"""Which ``Host`` the admin port answers: IP literals, ``localhost`` and the names set in
``SIDECAR_ADMIN_ALLOWED_HOSTS``; any other gets ``421`` and nothing of the state.

The admin port has no authentication, so a web page the operator opens could read
``/metrics`` or ``/ui/state.json`` through DNS rebinding: its own name made to resolve to
the pod's or the machine's address, the browser then sends that name as ``Host``. Kubelet
probes and Prometheus scrapes address a pod by its IP, so they pass as they are.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def host_name(host: str) -> str | None:
    """The name or address in a ``Host`` value without its port (a v6 literal without its
    brackets), lower-cased; ``None`` when the value is not one."""
    if host.startswith("["):
        address, bracket, port = host[1:].partition("]")
        if not bracket or (port and not (port[:1] == ":" and port[1:].isdigit())):
            return None
        return address.lower()
    name, colon, port = host.rpartition(":") if ":" in host else (host, "", "")
    if colon and not port.isdigit():
        return None
    return name.lower() or None


def admin_host_allowed(host: str | None, allowed: frozenset[str]) -> bool:
    """Whether the admin port answers a request whose ``Host`` is ``host``."""
    name = host_name(host) if host else None
    if name is None:
        return False
    if name in ("localhost", "localhost.") or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def admin_host_check(allowed: frozenset[str]) -> Middleware:
    """An aiohttp middleware refusing the ``Host`` values ``admin_host_allowed`` does not."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not admin_host_allowed(request.headers.get("Host"), allowed):
            return web.Response(status=421)
        return await handler(request)

    return check
