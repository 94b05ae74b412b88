"""Application assembly: the proxy app, the admin app, and their shared state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from yarl import URL

from sidecar.config.served import RouteConfig, ServedSettings
from sidecar.repair.pipeline import Repairs
from sidecar.repair.schemas import SchemaStore
from sidecar.retry.engine import Clock, Engine, Sleep
from sidecar.retry.guards.fleet import StateStore
from sidecar.serve.admin_host import admin_host_check
from sidecar.serve.agentserver import AgentServer
from sidecar.serve.proxy import Proxy
from sidecar.serve.routing import RouteTable
from sidecar.serve.ui.page import live_view_routes
from sidecar.telemetry import Hooks, build_hooks
from sidecar.telemetry.logging_setup import http_server_logger
from sidecar.telemetry.loop_lag import watch_loop_lag
from sidecar.telemetry.metric_definitions import Metrics
from sidecar.telemetry.recent import RecentCalls
from sidecar.transport.exchange import create_pool
from sidecar.wire.buffers import BufferBudget

if TYPE_CHECKING:
    import openai


@dataclass(slots=True)
class Lifecycle:
    """Whether the proxy accepts traffic: read by ``/readyz``, set by the server."""

    ready: bool = False
    draining: bool = False


PROXY = web.AppKey("proxy", Proxy)
ENGINE = web.AppKey("engine", Engine)
# The live page's sink; absent when ``SIDECAR_UI`` is off.
RECENT_CALLS = web.AppKey("recent_calls", RecentCalls)
METRICS = web.AppKey("metrics", Metrics)
HOOKS = web.AppKey("hooks", Hooks)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
ADMIN_HOSTS = web.AppKey("admin_hosts", frozenset[str])
BUFFERS = web.AppKey("buffers", BufferBudget)


# How long an unread request body is drained after the answer went out (aiohttp: 10 s),
# so that a client still sending sees the answer rather than a reset.
LINGERING_S = 2.0


SCHEMA_FETCH_TIMEOUT_S = 10.0

# Answers at most this large are read whole so the status and envelope can be judged;
# anything larger is streamed to the agent as it arrives.
INSPECT_LIMIT_BYTES = 256 * 1024


def create_app(
    settings: ServedSettings,
    *,
    registry: CollectorRegistry | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = time.monotonic,
) -> web.Application:
    """The proxy app. Its upstream session lives exactly as long as the app runs.

    ``sleep`` and ``clock`` drive every wait, deadline, budget and circuit: tests pass
    their own to control time without changing behaviour.
    """
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    recent = RecentCalls() if settings.ui else None
    hooks = build_hooks(
        metrics,
        access_log=settings.access_log,
        clock=clock,
        llm_model=settings.llm_model,
        recent=recent,
    )
    route_configs = settings.route_configs
    routes = RouteTable(route_configs)

    app = web.Application()
    app[METRICS] = metrics
    app[HOOKS] = hooks
    app[LIFECYCLE] = Lifecycle()
    app[ADMIN_HOSTS] = settings.admin_allowed_hosts
    buffers = app[BUFFERS] = BufferBudget(settings.max_buffered_bytes)
    metrics.buffered_bytes.read = lambda: buffers.used
    if recent is not None:
        app[RECENT_CALLS] = recent

    async def upstream_session(app: web.Application) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as held:
            # Spans still buffered go out last; exporting blocks, so off the event loop.
            held.push_async_callback(asyncio.to_thread, hooks.close)
            held.push_async_callback(
                _cancelled, asyncio.create_task(watch_loop_lag(metrics.loop_lag))
            )
            app[ENGINE] = await _start_engine(held, settings, route_configs, hooks, sleep, clock)
            app[PROXY] = _proxy(settings, routes, app[ENGINE], hooks, buffers)
            yield

    app.cleanup_ctx.append(upstream_session)
    return app


def _proxy(
    settings: ServedSettings,
    routes: RouteTable,
    engine: Engine,
    hooks: Hooks,
    buffers: BufferBudget,
) -> Proxy:
    return Proxy(
        routes,
        engine,
        hooks,
        max_request_bytes=settings.max_request_bytes,
        max_in_flight=settings.max_in_flight,
        client_timeout_s=settings.client_timeout_ms / 1000,
        buffers=buffers,
    )


async def _start_engine(
    held: contextlib.AsyncExitStack,
    settings: ServedSettings,
    routes: tuple[RouteConfig, ...],
    hooks: Hooks,
    sleep: Sleep,
    clock: Clock,
) -> Engine:
    """The retry engine and what it holds open (the pool, the store, the LLM client, the
    schemas), each closed by ``held`` in the reverse order."""
    pool = create_pool(settings.upstream_max_connections, settings.max_header_bytes)
    held.push_async_callback(pool.close)
    state = StateStore.from_settings(settings, hooks, clock)
    if state is not None:
        held.push_async_callback(state.close)
    llm_client = llm_client_for(settings)
    repairer = None
    if llm_client is not None:
        from sidecar.repair.llm import LlmRepairer  # with its prompt and answer modules

        held.push_async_callback(llm_client.close)
        repairer = LlmRepairer(
            llm_client,
            settings.llm_model,
            hooks,
            max_concurrency=settings.llm_max_concurrency,
            max_answer_tokens=settings.llm_max_answer_tokens,
            call_timeout_s=settings.llm_timeout_ms / 1000,
            clock=clock,
            shared=state.by_route(routes) if state is not None else None,
        )
        held.callback(repairer.close)
    schemas = await _load_schemas(held, settings, routes, hooks)
    return Engine(
        pool,
        hooks,
        routes,
        Repairs(schemas, repairer, hooks),
        inspect_limit=INSPECT_LIMIT_BYTES,
        sleep=sleep,
        clock=clock,
        state=state,
    )


async def _load_schemas(
    held: contextlib.AsyncExitStack,
    settings: ServedSettings,
    routes: tuple[RouteConfig, ...],
    hooks: Hooks,
) -> SchemaStore:
    """The routes' schemas, loaded now and refreshed in the background until ``held`` closes.

    Schema documents come through aiohttp's own client: a few fetches, off the hot path.
    """
    session = aiohttp.ClientSession()
    held.push_async_callback(session.close)
    schemas = SchemaStore(
        {route.name: route.schema_source for route in routes}, hooks.schema_unavailable
    )
    await schemas.load(session, SCHEMA_FETCH_TIMEOUT_S)
    refresh = asyncio.create_task(
        schemas.refresh_forever(session, SCHEMA_FETCH_TIMEOUT_S, settings.schema_refresh_ms / 1000)
    )
    held.push_async_callback(_cancelled, refresh)
    return schemas


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[web.Application]:
    """The proxy app started (its upstream pool, schemas and engine), cleaned up on exit."""
    app.on_startup.freeze()
    await app.startup()
    app.freeze()
    try:
        yield app
    finally:
        await app.cleanup()


def proxy_server(app: web.Application, settings: ServedSettings) -> AgentServer:
    """A running proxy app on the agent-facing server (``httpserver``).

    Every method and path (CONNECT's host:port and OPTIONS's ``*`` too) goes to the
    proxy. A connection that has not completed a request head within the client timeout
    (a new one, or an idle kept-alive one) is closed. After an answer to a request whose
    body was not read whole, the rest is read and dropped for a short while only. The
    request line and each header line may be as long as the whole header limit (aiohttp's
    default is 8 KiB a line); the proxy holds the section's total to it. A header line's
    limit is one byte more, so that a line over it tells which limit was passed (414 or
    431); the section's total catches that byte.
    """
    return AgentServer(
        app[PROXY].handle,
        client_timeout_s=settings.client_timeout_ms / 1000,
        max_header_bytes=settings.max_header_bytes,
        lingering_s=LINGERING_S,
        logger=http_server_logger(),
        buffers=app[BUFFERS],
    )


def llm_client_for(settings: ServedSettings) -> openai.AsyncOpenAI | None:
    """The process's one OpenAI-compatible client, when an endpoint or key is configured.

    Built with ``max_retries=0``: the sidecar's own loop is the only retry there is; its
    answers read and inflated to at most ``llm_max_answer_bytes`` (``repair.llm_http``).
    ``openai`` is imported only then: it alone would double the sidecar's memory.
    """
    if settings.llm_base_url is None and settings.llm_api_key is None:
        return None
    import openai

    from sidecar.repair.llm_http import bounded_http_client

    # The client appends each endpoint's path to the base URL's text, query included
    # (``/v1?api-key=K`` would become ``/v1/?api-key=Kchat/completions``): a query such as
    # Azure's ``api-key`` or ``api-version`` is passed as the default query instead.
    base_url = URL(settings.llm_base_url) if settings.llm_base_url else None
    return openai.AsyncOpenAI(
        base_url=str(base_url.with_query(None)) if base_url else None,
        default_query=dict(base_url.query) if base_url and base_url.query else None,
        # Local OpenAI-compatible servers need no key; the client insists on one.
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else "none",
        max_retries=0,
        timeout=settings.llm_timeout_ms / 1000,
        http_client=bounded_http_client(openai, settings.llm_max_answer_bytes),
    )


def create_admin_app(proxy_app: web.Application) -> web.Application:
    """``/metrics``, ``/healthz``, ``/readyz`` and, unless ``SIDECAR_UI`` is off, the live
    page ``/ui`` for the given proxy app, to the ``Host`` values ``admin_host`` allows."""
    metrics = proxy_app[METRICS]
    lifecycle = proxy_app[LIFECYCLE]

    async def metrics_text(request: web.Request) -> web.Response:
        # OpenMetrics (which carries exemplars) only for a scraper that asks for it.
        if "application/openmetrics-text" in request.headers.get("Accept", ""):
            text = openmetrics.generate_latest(metrics.registry)  # type: ignore[no-untyped-call]
            response = web.Response(body=text)
            response.headers["Content-Type"] = openmetrics.CONTENT_TYPE_LATEST
        else:
            response = web.Response(body=generate_latest(metrics.registry))
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if lifecycle.draining:
            return web.json_response({"status": "draining"}, status=503)
        if not lifecycle.ready:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ready"})

    admin = web.Application(middlewares=[admin_host_check(proxy_app[ADMIN_HOSTS])])
    admin.router.add_get("/metrics", metrics_text)
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    if RECENT_CALLS in proxy_app:
        # The engine is looked up when the page asks: it starts with the proxy app.
        admin.add_routes(
            live_view_routes(proxy_app[RECENT_CALLS], lambda: proxy_app[ENGINE].guards)
        )
    admin.on_response_prepare.append(_unnamed)
    return admin


async def _unnamed(_: web.Request, response: web.StreamResponse) -> None:
    """The admin port does not name the software and versions behind it either."""
    response.headers.popall("Server", None)
