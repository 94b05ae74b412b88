"""Running the sidecar as a process: bind, report readiness, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import signal
import socket
from collections.abc import Awaitable
from typing import Any

import structlog
from aiohttp import web

from sidecar import __version__
from sidecar.config.served import ServedSettings
from sidecar.outcomes import out_of_descriptors
from sidecar.serve.agentserver import AgentServer
from sidecar.serve.app import (
    HOOKS,
    LIFECYCLE,
    PROXY,
    create_admin_app,
    create_app,
    proxy_server,
    running,
)
from sidecar.telemetry import Hooks

# Connections the kernel may queue before the sidecar accepts them. An agent fleet that
# connects at once overflows aiohttp's default of 128 and sees connects dropped.
ACCEPT_BACKLOG = 4096
# After the drain time, requests cut short get this long to write their last answer.
_CUT_GRACE_S = 0.25
# How often the count of open file descriptors is compared with the process's limit.
_FD_CHECK_INTERVAL_S = 1.0
_FD_USE_REPORTED = 0.95
# Allocations (net) between two collections of the youngest generation; Python's is 700.
GC_YOUNG_THRESHOLD = 20_000


class StartupError(Exception):
    """The sidecar could not start serving, stated in one line that is safe to print."""


async def _listen(
    listening: Awaitable[None], host: str, port: int, role: str, host_variable: str
) -> None:
    """Await ``listening`` on ``host``:``port`` for ``role``, or say in one line why that is
    impossible."""
    try:
        await listening
    except socket.gaierror as exc:
        raise StartupError(
            f"cannot listen on {host} ({host_variable}): not an address of this machine "
            f"or a name that resolves ({exc.strerror})"
        ) from None
    except OSError as exc:
        # asyncio puts the address into the message; the errno alone says what went wrong.
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise StartupError(f"cannot listen on {host}:{port}, the {role}: {reason}") from None


async def serve(settings: ServedSettings) -> None:
    """Serve until a SIGTERM/SIGINT arrives, then drain and return.

    Draining: ``/readyz`` turns 503, the proxy stops listening, and requests in flight
    get up to ``drain_timeout_ms`` to finish. Then those still waiting for the tool are
    answered ``UPSTREAM_TIMEOUT`` (reason ``shutdown``), the rest are cut, and the
    process exits well within a second more.
    """
    log = structlog.get_logger("sidecar")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    app = create_app(settings)
    lifecycle = app[LIFECYCLE]
    _report_descriptor_exhaustion(loop, app[HOOKS])
    fd_watch = asyncio.create_task(_watch_descriptors(app[HOOKS]))
    async with running(app):
        agents = proxy_server(app, settings)
        admin_runner = web.AppRunner(create_admin_app(app), access_log=None)
        await admin_runner.setup()
        try:
            await _listen_on_both(settings, agents, admin_runner)
            _settle_heap()
            lifecycle.ready = True
            log.info(
                "sidecar_started",
                version=__version__,
                proxy_port=agents.port,
                admin_port=admin_runner.addresses[0][1],
                routes=[route.name for route in settings.route_configs],
            )
            await stop.wait()
            lifecycle.draining = True
            log.info("shutdown_started", drain_timeout_ms=settings.drain_timeout_ms)
            agents.stop_listening()
            await app[PROXY].drain(settings.drain_timeout_ms / 1000)
        finally:
            fd_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fd_watch
            # The admin app outlives the drain, so /readyz answers 503 while requests finish.
            await agents.close(_CUT_GRACE_S)
            await admin_runner.cleanup()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
    log.info("sidecar_stopped")


async def _listen_on_both(
    settings: ServedSettings, agents: AgentServer, admin_runner: web.BaseRunner
) -> None:
    """The admin port first, so that a probe finds it as soon as the proxy accepts."""
    await _listen(
        web.TCPSite(admin_runner, settings.admin_host, settings.admin_port).start(),
        settings.admin_host,
        settings.admin_port,
        "admin port (SIDECAR_ADMIN_PORT)",
        "SIDECAR_ADMIN_HOST",
    )
    await _listen(
        agents.start(settings.host, settings.port, backlog=ACCEPT_BACKLOG),
        settings.host,
        settings.port,
        "proxy port (SIDECAR_PORT)",
        "SIDECAR_HOST",
    )


def _settle_heap() -> None:
    """Take what start-up built out of the garbage collector's rounds.

    The modules, settings and routes built at start live as long as the process, yet each
    collection walked them again among every request's short-lived objects. Frozen, they
    are left out of every later collection; a larger youngest generation (a request makes
    a few hundred objects, and few reference cycles) collects them less often. Together:
    0.95x the CPU per request (bench/ab_sidecar.py, c=64).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


async def _watch_descriptors(hooks: Hooks) -> None:
    """Report when the process is about to run out of file descriptors.

    Out of descriptors, new agents' connections wait in the kernel's queue (the proxy
    port tries to accept them again each second) and the tool cannot be reached: the
    sidecar's own saturation, which must not pass for the tool's failure.
    """
    limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    while limit != resource.RLIM_INFINITY:
        await asyncio.sleep(_FD_CHECK_INTERVAL_S)
        try:
            exhausted = len(os.listdir("/proc/self/fd")) >= limit * _FD_USE_REPORTED
        except OSError as exc:  # listing takes a descriptor too
            if not out_of_descriptors(exc):
                return  # no /proc: nothing to watch with
            exhausted = True
        if exhausted:
            hooks.sidecar_overloaded(None, "fd_exhausted")


def _report_descriptor_exhaustion(loop: asyncio.AbstractEventLoop, hooks: Hooks) -> None:
    """Out of file descriptors, asyncio's own loop cannot accept connections and logs a
    traceback per try; say it once per interval as the sidecar's own overload instead."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and out_of_descriptors(exc):
            hooks.sidecar_overloaded(None, "fd_exhausted")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
