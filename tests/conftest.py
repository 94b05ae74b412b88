"""Real servers on 127.0.0.1: scripted tools upstream, the sidecar in between."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import importlib.machinery
import inspect
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from prometheus_client import CollectorRegistry
from yarl import URL

from sidecar.build import COMPILED_MODULES
from sidecar.config import load_settings
from sidecar.serve.agentserver import AgentServer
from sidecar.serve.app import create_app, proxy_server, running

if TYPE_CHECKING:
    from tests.redis_store import RedisServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Hypothesis's timing checks (slow input generation, per-example deadlines) measure the
# machine, not the code: on a busy 2-core CI runner with an empty example database they
# fail at random. Timing belongs in bench/. CI also derandomizes, so a red run is
# reproducible from its log alone.
_NO_TIMING = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
hypothesis_settings.register_profile("dev", **_NO_TIMING)
hypothesis_settings.register_profile("ci", derandomize=True, database=None, **_NO_TIMING)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")


# The build of the package the suite runs on: "pure" (the README's editable install, which
# is always pure) or "compiled" (.ci/run's run on the wheel's extension modules). The
# session stops before any test when the package imported is not that build, so a
# compiled run that fell back to pure Python cannot pass unseen.
BUILD_UNDER_TEST = os.environ.get("PYTEST_SIDECAR_BUILD", "pure")


def imported_extension_modules() -> tuple[str, ...]:
    """The hot path's modules that Python imported from an extension module, read from
    each imported module's file (not from ``sidecar.build``, whose answer this checks)."""
    return tuple(
        name
        for name in COMPILED_MODULES
        if str(importlib.import_module(name).__file__).endswith(
            tuple(importlib.machinery.EXTENSION_SUFFIXES)
        )
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    expected = {"pure": (), "compiled": COMPILED_MODULES}.get(BUILD_UNDER_TEST)
    if expected is None:
        pytest.exit(f"PYTEST_SIDECAR_BUILD is 'pure' or 'compiled', not {BUILD_UNDER_TEST!r}", 4)
    found = imported_extension_modules()
    if found != expected:
        pytest.exit(
            f"the suite runs on the {BUILD_UNDER_TEST} build (PYTEST_SIDECAR_BUILD), but "
            f"{len(found)} of the {len(COMPILED_MODULES)} hot-path modules imported compiled: "
            f"{', '.join(found) or 'none'}",
            4,
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take what collection loaded out of the garbage collector's rounds, as ``serve`` does
    with its start-up heap. The suite imports the MCP SDK, FastAPI, OpenTelemetry, httpbin
    and the rest: some 230,000 objects that a full collection walked again in 140-270 ms,
    long enough to time out a test's 100 ms connect when it landed inside one."""
    gc.collect()
    gc.freeze()


@dataclass
class Seen:
    """What the tool received: one entry per request."""

    method: str
    raw_path: str
    headers: Any
    body: bytes
    peer: tuple[str, int]


@dataclass
class Tool:
    server: TestServer
    seen: list[Seen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.server.make_url("/"))


class FakeClock:
    """A monotonic clock that moves only when a test, or a ``RecordingSleep``, moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingSleep:
    """Stands in for ``asyncio.sleep``: records each wait and returns at once.

    Given a ``FakeClock``, each wait moves that clock on by its length, so waiting uses up
    deadlines, budgets and circuit windows exactly as real time would.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.waits: list[float] = []
        self._clock = clock

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self._clock is not None:
            self._clock.now += seconds


@dataclass
class Sidecar:
    client: TestClient
    registry: CollectorRegistry
    sleep: Any
    app: web.Application

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def label_values(self, label: str) -> set[str]:
        """Every value ``label`` takes across all the sidecar's series."""
        return {
            sample.labels[label]
            for family in self.registry.collect()
            for sample in family.samples
            if label in sample.labels
        }


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests configure the sidecar explicitly; the developer's shell must not leak in."""
    for name in list(os.environ):
        if name.startswith(("SIDECAR_", "GOMIND_AGENT_", "OPENAI_", "OTEL_")):
            monkeypatch.delenv(name)


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis-compatible server of the test's own, for fleet state."""
    from tests.redis_store import RedisServer  # which builds on this module's helpers

    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def make_tool(aiohttp_server: Any) -> Callable[..., Awaitable[Tool]]:
    """A tool whose every request is recorded and then answered by ``handler``."""

    async def make(handler: Handler, **server_kwargs: Any) -> Tool:
        tool: Tool

        async def recording(request: web.Request) -> web.StreamResponse:
            tool.seen.append(
                Seen(
                    request.method,
                    request.raw_path,
                    request.headers,
                    await request.read(),
                    request.transport.get_extra_info("peername"),
                )
            )
            return await handler(request)

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", recording)
        tool = Tool(await aiohttp_server(app, **server_kwargs))
        return tool

    return make


@pytest.fixture
async def make_sidecar(aiohttp_client: Any) -> AsyncIterator[Callable[..., Awaitable[Sidecar]]]:
    """A sidecar app served on loopback, configured from keyword settings."""
    async with contextlib.AsyncExitStack() as apps:

        async def make(
            upstream: str | Tool | None = None,
            *,
            sleep: Any = None,
            clock: Any = time.monotonic,
            **settings: Any,
        ) -> Sidecar:
            if isinstance(upstream, Tool):
                upstream = upstream.url
            registry = CollectorRegistry()
            sleep = sleep or RecordingSleep(clock if isinstance(clock, FakeClock) else None)
            configuration = load_settings(upstream_url=upstream, **settings).served()
            app = create_app(configuration, registry=registry, sleep=sleep, clock=clock)
            await apps.enter_async_context(running(app))
            server = ServedProxy(proxy_server(app, configuration))
            await server.start_server()
            client = await aiohttp_client(server, auto_decompress=False)
            return Sidecar(client, registry, sleep, app)

        yield make


class ServedProxy(BaseTestServer):
    """The proxy's own server (``AgentServer``) on loopback, as ``serve`` runs it, for
    aiohttp's test client: what the client asks of a test server, and no runner."""

    def __init__(self, agents: AgentServer) -> None:
        super().__init__()
        self.agents = agents
        self._listening = False

    async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
        if self._listening:
            return
        await self.agents.start(self.host, 0, backlog=128)
        self.port = self.agents.port
        self.scheme = "http"
        self._listening = True

    def make_url(self, path: Any) -> URL:
        url = URL(path)
        assert not url.absolute
        return URL.build(scheme="http", host=self.host, port=self.port).join(url)

    @property
    def started(self) -> bool:
        return self._listening

    async def close(self) -> None:
        if self._listening:
            self._listening = False
            await self.agents.close(grace_s=0.25)

    async def _make_runner(self, **kwargs: Any) -> web.ServerRunner:
        raise NotImplementedError("the proxy's server is no aiohttp runner's")


def scripted(*answers: Callable[[], web.StreamResponse]) -> Handler:
    """A handler answering the n-th request with ``answers[n]`` (the last one repeats)."""
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        answer = answers[min(calls, len(answers) - 1)]
        calls += 1
        return answer()

    return handler


def unused_port() -> int:
    """A loopback port with nothing listening on it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def hang() -> NoReturn:
    """What a tool (or an agent's body) that never goes on does: wait for what never comes,
    until it is cancelled. Not a long sleep: nothing in a test should hinge on its length."""
    await asyncio.Event().wait()
    raise AssertionError("an event nobody sets was set")


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0
) -> None:
    """Wait until ``condition()`` holds, looking every few milliseconds, for ``timeout_s``.

    Before a negative check, wait for the event after which what is checked can no longer
    happen (the request finished, the connection closed), never for a fixed time.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        holds = condition()
        if inspect.isawaitable(holds):
            holds = await holds
        if holds:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"still not true after {timeout_s} s: {condition}")
        await asyncio.sleep(0.005)


def base_url(url: str | URL) -> str:
    return str(URL(str(url)).origin())


@dataclass
class Llm:
    """An OpenAI-compatible endpoint on loopback, answering from a script."""

    server: TestServer
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("/v1"))

    def prompt(self, index: int = -1) -> dict[str, Any]:
        """The user message of a recorded request, as the JSON document it is."""
        return orjson.loads(self.requests[index]["messages"][-1]["content"])


def completion(content: str, prompt_tokens: int = 120, completion_tokens: int = 30) -> web.Response:
    return web.json_response(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


@pytest.fixture
def make_llm(aiohttp_server: Any) -> Callable[..., Awaitable[Llm]]:
    """``make_llm(answer, ...)``: the n-th call gets the n-th answer (the last repeats).

    An answer is a dict (sent as the model's JSON content), a str (sent as content as it
    is), or a callable returning a ``web.Response`` (errors, stalls).
    """

    async def make(*answers: Any) -> Llm:
        llm: Llm

        async def chat(request: web.Request) -> web.StreamResponse:
            llm.requests.append(await request.json())
            answer = answers[min(len(llm.requests), len(answers)) - 1]
            if callable(answer):
                return await answer()
            return completion(answer if isinstance(answer, str) else orjson.dumps(answer).decode())

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        llm = Llm(await aiohttp_server(app))
        return llm

    return make
