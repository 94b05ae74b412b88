"""aiohttp's low-level server, as the proxy is served on it.

aiohttp answers a request it cannot parse (or a handler's crash) with a text page that
quotes the request; an agent reading envelopes gets the envelope and the report instead,
and nothing of what it sent is echoed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from sidecar.serve import answers

ProxyHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class ProxyServer(web.Server):
    """aiohttp's low-level server, whose own answers to broken requests are the sidecar's."""

    def __init__(self, handler: ProxyHandler, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._protocol_kwargs = {
            key: value for key, value in kwargs.items() if key != "handler_cancellation"
        }

    def __call__(self) -> web.RequestHandler:
        return _ProxyRequestHandler(self, loop=asyncio.get_running_loop(), **self._protocol_kwargs)


class _ProxyRequestHandler(web.RequestHandler):
    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._request_line_limit: int = kwargs["max_line_size"]

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own handling logs the error (a client's as its fault) and checks that
        # no answer has started yet; its text page is replaced.
        super().handle_error(request, status, exc, message)
        refusal = _refusal_for(status, exc, self._request_line_limit)
        response = refusal.response(answers.own_report(refusal.error))
        response.force_close()
        return response


def _refusal_for(
    status: int, exc: BaseException | None, request_line_limit: int
) -> answers.Refusal:
    if status >= 500:
        return answers.Refusal(answers.SIDECAR_ERROR, "the sidecar failed to handle the request")
    if isinstance(exc, LineTooLong):
        # aiohttp names the limit that was passed: the request line's, or a header line's.
        if exc.args[1:2] == (request_line_limit,):
            return answers.Refusal(answers.URI_TOO_LONG, "the request line is too long")
        return answers.Refusal(
            answers.HEADERS_TOO_LARGE, "a header line of the request is too long"
        )
    return answers.Refusal(answers.BAD_REQUEST, "the request is not valid HTTP/1.1")
