"""Running the sidecar as a process: bind, report readiness, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import structlog
from aiohttp import web

from sidecar import __version__
from sidecar.app import LIFECYCLE, SERVER_KWARGS, create_admin_app, create_app
from sidecar.settings import Settings, resolve_routes


class StartupError(Exception):
    """The sidecar could not start serving, stated in one line that is safe to print."""


async def _listen(runner: web.AppRunner, host: str, port: int, role: str) -> None:
    """Listen on ``host``:``port`` for ``role``, or say in one line why that is impossible."""
    try:
        await web.TCPSite(runner, host, port).start()
    except socket.gaierror as exc:
        raise StartupError(
            f"cannot listen on {host} (SIDECAR_HOST): not an address of this machine "
            f"or a name that resolves ({exc.strerror})"
        ) from None
    except OSError as exc:
        # asyncio puts the address into the message; the errno alone says what went wrong.
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise StartupError(f"cannot listen on {host}:{port}, the {role}: {reason}") from None


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
        await _listen(
            admin_runner, settings.host, settings.admin_port, "admin port (SIDECAR_ADMIN_PORT)"
        )
        await _listen(proxy_runner, settings.host, settings.port, "proxy port (SIDECAR_PORT)")
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
