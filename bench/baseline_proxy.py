"""The baseline: a minimal hand-written aiohttp pass-through proxy, as one would write it.

python bench/baseline_proxy.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


async def make_app(upstream: str) -> web.Application:
    async def session_ctx(app: web.Application):
        app["session"] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with request.app["session"].request(
            request.method,
            upstream + request.raw_path,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as answer:
            body = await answer.read()
            out = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=answer.status, body=body, headers=out)

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{path:.*}", forward)
    return app


if __name__ == "__main__":
    port, upstream = int(sys.argv[1]), sys.argv[2].rstrip("/")
    uvloop.install()
    web.run_app(make_app(upstream), host="127.0.0.1", port=port, access_log=None, print=None)
