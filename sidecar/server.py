"""Running the sidecar as a process: bind, report readiness, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal

import structlog
from aiohttp import web

from sidecar import __version__
from sidecar.app import LIFECYCLE, SERVER_KWARGS, create_admin_app, create_app
from sidecar.settings import Settings, resolve_routes


async def serve(settings: Settings) -> None:
    """Serve until a SIGTERM/SIGINT arrives, then drain and return.

    Draining: ``/readyz`` turns 503, the proxy stops listening, and requests in flight
    get up to ``drain_timeout_ms`` to finish before they are cancelled.
    """
    log = structlog.get_logger("sidecar")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    app = create_app(settings)
    lifecycle = app[LIFECYCLE]
    proxy_runner = web.AppRunner(
        app, shutdown_timeout=settings.drain_timeout_ms / 1000, **SERVER_KWARGS
    )
    admin_runner = web.AppRunner(create_admin_app(app), access_log=None)
    await proxy_runner.setup()
    await admin_runner.setup()
    try:
        await web.TCPSite(admin_runner, settings.admin_host, settings.admin_port).start()
        await web.TCPSite(proxy_runner, settings.host, settings.port).start()
        lifecycle.ready = True
        log.info(
            "sidecar_started",
            version=__version__,
            proxy_port=proxy_runner.addresses[0][1],
            admin_port=admin_runner.addresses[0][1],
            routes=[route.name for route in resolve_routes(settings)],
        )
        await stop.wait()
        lifecycle.draining = True
        log.info("shutdown_started", drain_timeout_ms=settings.drain_timeout_ms)
    finally:
        # The admin app outlives the drain, so /readyz answers 503 while requests finish.
        await proxy_runner.cleanup()
        await admin_runner.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("sidecar_stopped")
