"""An aiohttp upstream for the benchmark: fixed JSON, optionally slow or half failing.

python bench/upstream.py PORT [--delay-ms N] [--fail-ratio R]
"""

from __future__ import annotations

import argparse
import asyncio
import random

import uvloop
from aiohttp import web

OK = b'{"success": true, "data": {"temp_c": 21.5, "location": "Tokyo, Japan"}}'
BUSY = (
    b'{"success": false, "error": {"code": "BUSY", "category": "SERVICE_ERROR", "retryable": true}}'
)


def make_app(delay_s: float, fail_ratio: float) -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        if delay_s:
            await asyncio.sleep(delay_s)
        if fail_ratio and random.random() < fail_ratio:
            return web.Response(status=503, body=BUSY, content_type="application/json")
        return web.Response(body=OK, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--delay-ms", type=float, default=0)
    parser.add_argument("--fail-ratio", type=float, default=0)
    args = parser.parse_args()
    uvloop.install()
    web.run_app(
        make_app(args.delay_ms / 1000, args.fail_ratio),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        backlog=4096,
    )
