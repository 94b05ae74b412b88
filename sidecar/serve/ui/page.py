"""``GET /ui``: one page, its script and its style, all shipped in the package, and the
JSON state the page polls once a second.

Nothing is fetched from anywhere but the admin port itself, and the page's Content
Security Policy says so to the browser too: no CDN, no external font, and it works
offline. The page polls rather than holding a server-sent event stream open: a poll is
one short request a browser, ``curl`` or a test can make alike, and nothing stays open
on the admin port to hold up a shutdown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.resources import files

from aiohttp import web

from sidecar.retry.guards.route import RouteGuards
from sidecar.serve.ui.state import LiveState
from sidecar.telemetry.recent import RecentCalls

# The page's own files, by the name it asks for them under /ui/, and their types.
ASSETS = {
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
}
PAGE = "ui.html"

# Only the admin port's own page, script, style and state: no other origin, no inline code.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static(name: str) -> bytes:
    return (files(__package__) / "static" / name).read_bytes()


def live_view_routes(
    recent: RecentCalls, guards: Callable[[], Mapping[str, RouteGuards]]
) -> list[web.RouteDef]:
    """The page's routes, reading ``recent`` and the guards ``guards()`` returns.

    The files are read now, so an installation that lacks them fails at start.
    """
    state = LiveState(recent, guards)
    page = _static(PAGE)
    assets = {name: (_static(name), kind) for name, kind in ASSETS.items()}

    async def show_page(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=_HEADERS)

    async def show_asset(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound
        body, kind = found
        return web.Response(body=body, headers={**_HEADERS, "Content-Type": kind})

    async def show_state(_: web.Request) -> web.Response:
        return web.json_response(state.document(), headers=_HEADERS)

    async def to_page(_: web.Request) -> web.Response:
        # Relative, so the page is found behind a path prefix (kubectl proxy) too.
        raise web.HTTPFound("../ui")

    return [
        web.get("/ui", show_page),
        web.get("/ui/", to_page),
        web.get("/ui/state.json", show_state),
        web.get("/ui/{name}", show_asset),
    ]
