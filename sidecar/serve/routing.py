"""Which route a request belongs to, and the exact upstream target it is sent to."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from yarl import URL

from sidecar.config import RouteConfig

# A "." or ".." path segment, also percent-encoded: resolved by the tool, it could climb out
# of the route's prefix or the upstream's base path. Delimited by what some servers take for
# a separator too: a backslash or ``%5c`` (IIS, Node's WHATWG URL), a ``;`` that starts
# path parameters (Tomcat and Jetty read ``/..;/`` as ``/../``).
_DOT_SEGMENT = re.compile(r"(?:^|/|\\|%5c)(?:\.|%2e){1,2}(?:/|\\|%5c|;|$)", re.IGNORECASE)


def target_fault(raw_target: str) -> str | None:
    """Why ``raw_target``, as the agent sent it, cannot go to a tool, or ``None``.

    A ``#`` is not valid in a request-target (RFC 9112 §3.2): URL libraries drop what
    follows it, so ``/weather/..#x`` would pass the check below and reach the tool as
    ``/weather/..``. The dot-segment check reads the target as received, never a parsed
    form of it.
    """
    if "#" in raw_target:
        return "the request-target holds a '#'"
    path = raw_target.partition("?")[0]
    if _DOT_SEGMENT.search(path.replace("%2f", "/").replace("%2F", "/")):
        return "path has a '.' or '..' segment"
    return None


@dataclass(frozen=True, slots=True)
class Target:
    """A matched route and the upstream URL, path and query kept byte for byte."""

    route: RouteConfig
    url: URL


class RouteTable:
    """Longest-prefix match on whole path segments: ``/weather`` never matches ``/weatherman``."""

    def __init__(self, routes: Iterable[RouteConfig]) -> None:
        self._routes = sorted(routes, key=lambda route: len(route.prefix), reverse=True)
        self._origins = {
            route.name: (str(route.upstream.origin()), route.upstream.raw_path.rstrip("/"))
            for route in self._routes
        }

    def match(self, raw_target: str) -> Target | None:
        """The route for a raw request target (path and query as the agent sent them).

        Only origin-form targets (``/path?query``) are routed; an absolute-form or
        asterisk-form target matches nothing, so a request can never choose its upstream.
        """
        if not raw_target.startswith("/"):
            return None
        path, question, query = raw_target.partition("?")
        for route in self._routes:
            prefix = route.prefix
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return Target(route, self._upstream_url(route, path, question + query))
        return None

    def _upstream_url(self, route: RouteConfig, path: str, query: str) -> URL:
        origin, base_path = self._origins[route.name]
        if route.strip_prefix and route.prefix != "/":
            path = path[len(route.prefix) :] or "/"
        return URL(origin + base_path + path + query, encoded=True)
