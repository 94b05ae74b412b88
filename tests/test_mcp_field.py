"""MCP's own state and streams through the sidecar, against the MCP SDK's server.

The server is the Python MCP SDK's streamable-HTTP server on uvicorn, as its users run it:
DNS-rebinding protection on (the SDK's default on 127.0.0.1), an event store where a test
needs resumable streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from aiohttp import web
from mcp import MCPError
from mcp.client.subscriptions import SubscriptionLost
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import ElicitResult, JSONRPCMessage
from pydantic import BaseModel
from structlog.testing import capture_logs

from sidecar.serve.app import PROXY
from tests.asgi import uvicorn_serving
from tests.mcp_relay import answer_head, asked, relay_rest
from tests.wire import Wire, leaf_errors, mcp_client

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "field-test", "version": "1"},
    },
}
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def sidecar_before(
    server: MCPServer, make_sidecar: Callable[..., Any], **settings: Any
) -> AsyncIterator[Any]:
    """The sidecar in front of ``server``'s streamable-HTTP app."""
    async with uvicorn_serving(server.streamable_http_app()) as url:
        yield await make_sidecar(url, **settings)


@pytest.mark.security
@pytest.mark.parametrize(
    ("headers", "refused_with"),
    [
        ({"Host": "evil.example.com"}, 421),
        ({"Origin": "http://evil.example.com"}, 403),
        ({}, None),
    ],
    ids=["rebound-host", "foreign-origin", "local"],
)
async def test_the_servers_dns_rebinding_check_judges_what_the_agent_sent(
    make_sidecar, headers, refused_with
):
    """The SDK's check refuses a rebound name or a foreign page through the sidecar as it
    does directly; with the sidecar's own address as ``Host`` (0.5) both got a session."""
    async with sidecar_before(MCPServer("local"), make_sidecar) as sidecar:
        answer = await sidecar.client.post(
            "/mcp", data=orjson.dumps(INITIALIZE), headers={**MCP_HEADERS, **headers}
        )
        body = await answer.read()

    if refused_with is None:
        assert answer.status == 200
        assert answer.headers["Mcp-Session-Id"]
    else:
        assert answer.status == refused_with
        assert "Mcp-Session-Id" not in answer.headers
        assert b"Invalid" in body
    assert answer.headers["X-Sidecar-Attempts"] == "1"


async def test_a_route_that_rewrites_host_names_the_tool(make_sidecar):
    """``host_rewrite``: the tool gets its own address, which its allow-list accepts."""
    async with sidecar_before(MCPServer("local"), make_sidecar, host_rewrite=True) as sidecar:
        answer = await sidecar.client.post(
            "/mcp",
            data=orjson.dumps(INITIALIZE),
            headers={**MCP_HEADERS, "Host": "agent.example"},
        )

    assert answer.status == 200


async def test_a_call_the_sidecar_gives_up_on_fails_alone_and_the_session_goes_on(make_sidecar):
    """The tool outlives the per-try timeout on a call not safe to send twice: the client gets
    the sidecar's JSON-RPC error for that call (``data`` says why) and its session serves the
    next call."""
    server = MCPServer("slow")

    @server.tool()
    async def transfer(amount: int) -> str:
        await asyncio.sleep(1 if amount > 100 else 0)
        return f"sent {amount}"

    app = server.streamable_http_app(json_response=True)
    async with uvicorn_serving(app) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=300)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            with pytest.raises(MCPError) as gave_up:
                await client.call_tool("transfer", {"amount": 500})
            after = await client.call_tool("transfer", {"amount": 5})

    assert gave_up.value.code == -32000
    assert gave_up.value.data["code"] == "UPSTREAM_TIMEOUT"
    assert gave_up.value.data["delivered"] == "maybe"
    assert after.content[0].text == "sent 5"
    first, second = wire.tool_calls()
    assert (first.status, first.headers["X-Sidecar-Outcome"]) == (200, "not-retryable")
    assert second.headers["X-Sidecar-Outcome"] == "ok"


async def test_a_2025_servers_refusal_of_the_version_probe_is_its_answer_not_a_failure(
    make_tool, make_sidecar
):
    """pydantic-ai and the SDK's ``auto`` mode open with ``server/discover``; a 2025 server
    answers 400 and the client speaks 2025. That is the probe's answer: ``ok``, no line."""

    async def legacy(request: web.Request) -> web.Response:
        refusal = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Bad"}}
        return web.json_response(refusal, status=400)

    sidecar = await make_sidecar(await make_tool(legacy))
    probe = {"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}}

    with capture_logs() as logs:
        answer = await sidecar.client.post("/mcp", json=probe, headers=MCP_HEADERS)
        tools_list = await sidecar.client.post(
            "/mcp", json={**probe, "method": "tools/list"}, headers=MCP_HEADERS
        )

    assert (answer.status, answer.headers["X-Sidecar-Outcome"]) == (400, "ok")
    assert (tools_list.status, tools_list.headers["X-Sidecar-Outcome"]) == (400, "not-retryable")
    assert [line["trail"] for line in logs if line["log_level"] == "info"] == ["400"]


# --- live streams: what comes before the answer goes to the agent as it comes --------------

# Long enough that a stream held for the inspection window would hold the test to its bound.
HOLD_MS = 60_000


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025-11-25", "2026-07-28"])
async def test_progress_reaches_the_client_while_the_tool_runs(make_sidecar, mode):
    """The tool finishes only once the client has its progress: a stream held until the
    answer (0.5, for up to the inspection window) would never let it."""
    heard = asyncio.Event()
    server = MCPServer("progress")

    @server.tool()
    async def crunch(ctx: Context) -> str:
        await ctx.report_progress(1, 2)
        await heard.wait()
        return "crunched"

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.set()

    async with uvicorn_serving(server.streamable_http_app()) as url:
        sidecar = await make_sidecar(url, inspect_timeout_ms=HOLD_MS)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode=mode) as client:
            with anyio.fail_after(10):
                result = await client.call_tool("crunch", {}, progress_callback=on_progress)

    assert result.content[0].text == "crunched"
    [call] = wire.tool_calls()
    assert (call.headers["X-Sidecar-Attempts"], call.headers["X-Sidecar-Outcome"]) == ("1", "ok")


async def test_an_elicitation_reaches_the_client_while_the_tool_waits_for_it(make_sidecar):
    """A 2025 server asks its client on the call's own stream; the client's answer is what
    the tool waits for."""
    server = MCPServer("asks")

    class Confirm(BaseModel):
        ok: bool

    @server.tool()
    async def transfer(amount: int, ctx: Context) -> str:
        answer = await ctx.elicit(f"send {amount}?", Confirm)
        return f"sent {amount}" if answer.action == "accept" and answer.data.ok else "kept"

    async def confirm(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="accept", content={"ok": True})

    async with uvicorn_serving(server.streamable_http_app()) as url:
        sidecar = await make_sidecar(url, inspect_timeout_ms=HOLD_MS)
        endpoint = str(sidecar.client.make_url("/mcp"))
        async with mcp_client(
            endpoint, Wire(), mode="legacy", elicitation_callback=confirm
        ) as client:
            with anyio.fail_after(10):
                result = await client.call_tool("transfer", {"amount": 5})

    assert result.content[0].text == "sent 5"


async def test_a_call_silent_past_the_per_try_timeout_after_its_progress_is_ended(make_sidecar):
    """Each event starts the per-try timer again; a tool silent for longer after its last
    one is given up as a silent tool is: its stream ends after its last whole event, the
    call runs once, and the client, whose server keeps no events to resume from, hears
    the stream ended."""
    runs = 0
    release = asyncio.Event()
    server = MCPServer("stalls")

    @server.tool()
    async def stall(ctx: Context) -> str:
        nonlocal runs
        runs += 1
        await ctx.report_progress(1, 2)
        await release.wait()
        return "done"

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        pass

    async with uvicorn_serving(server.streamable_http_app()) as url:
        sidecar = await make_sidecar(url, per_try_timeout_ms=300)
        wire = Wire()
        with capture_logs() as logs:
            async with mcp_client(
                str(sidecar.client.make_url("/mcp")), wire, mode="legacy"
            ) as client:
                with anyio.fail_after(10), pytest.raises(MCPError, match="ended"):
                    await client.call_tool("stall", {}, progress_callback=on_progress)
                release.set()

    assert runs == 1
    [ended] = [line for line in logs if line["event"] == "upstream_stream_ended"]
    assert ended["reason"] == "idle"


# --- resume before replay: a cut stream the server still holds is resumed, never a 502 -----


class ReplayingEventStore(EventStore):
    """Resumability as the SDK asks for it: every event kept, replayed after an id."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        streams = [stream for event_id, stream, _ in self.events if event_id == last_event_id]
        if not streams:
            return None
        later = self.events[int(last_event_id) :]
        for event_id, stream, message in later:
            if stream == streams[0] and message is not None:
                await send_callback(EventMessage(message, event_id))
        return streams[0]


@dataclass
class CuttingTap:
    """Relays every request to the MCP server as it streams, but cuts the first stream of a
    ``tools/call`` after its first whole event (the priming one): the call reached the
    server, which runs it and keeps its answer. ``GET``s that resume a stream (with a
    ``Last-Event-ID``) it records, and may refuse (503) the first ``refuse_gets`` of."""

    server_url: str
    http: aiohttp.ClientSession
    refuse_gets: int = 0
    cut: int = 0
    has_cut: asyncio.Event = field(default_factory=asyncio.Event)
    resumed_after: list[str] = field(default_factory=list)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = asked(request)
        sent = orjson.loads(body) if body else {}
        if request.method == "GET" and "Last-Event-ID" in request.headers:
            self.resumed_after.append(request.headers["Last-Event-ID"])
            if len(self.resumed_after) <= self.refuse_gets:
                return web.Response(status=503)
        cutting = sent.get("method") == "tools/call" and not self.cut
        async with self.http.request(
            request.method, self.server_url + request.path_qs, data=body, headers=headers
        ) as answer:
            relayed = await answer_head(request, answer)
            if cutting:
                self.cut += 1
                await relayed.write(await answer.content.readuntil(b"\r\n\r\n"))
                request.transport.close()
                self.has_cut.set()
                return relayed
            return await relay_rest(relayed, answer)


@asynccontextmanager
async def resumable_server(
    make_tool: Callable[..., Any], make_sidecar: Callable[..., Any], **tap: Any
) -> AsyncIterator[tuple[Any, CuttingTap, list[int]]]:
    """A server with an event store whose ``transfer`` is not safe to run twice, behind a
    tap that cuts its call's stream after the priming event, behind the sidecar."""
    server, runs, has_cut = MCPServer("resumable"), [0], asyncio.Event()

    @server.tool()
    async def transfer(amount: int) -> str:
        runs[0] += 1
        await has_cut.wait()  # answered after the cut
        return f"sent {amount}"

    app = server.streamable_http_app(event_store=ReplayingEventStore())
    async with uvicorn_serving(app) as url, aiohttp.ClientSession() as http:
        cutting = CuttingTap(url, http, has_cut=has_cut, **tap)
        sidecar = await make_sidecar(await make_tool(cutting))
        yield sidecar, cutting, runs


async def test_a_stream_cut_after_an_event_with_an_id_is_resumed_by_the_sidecar(
    make_tool, make_sidecar
):
    """0.5 answered ``502 UPSTREAM_RESET`` (and the call was lost); the SDK's client, direct,
    resumes it. The sidecar resumes it first: one run, the answer, no 502."""
    async with resumable_server(make_tool, make_sidecar) as (sidecar, cutting, runs):
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            result = await client.call_tool("transfer", {"amount": 5})

    assert result.content[0].text == "sent 5"
    assert runs == [1]
    [call] = wire.tool_calls()
    assert call.status == 200
    assert call.headers["X-Sidecar-Trail"] == "200 resumed"
    # The sidecar's GET, after the priming event's id.
    assert len(cutting.resumed_after) == 1


async def test_a_stream_the_sidecar_cannot_resume_goes_to_the_client_to_resume(
    make_tool, make_sidecar
):
    """The server refuses the sidecar's ``GET``: the client gets what was read, ending after
    the priming event, and resumes it itself through the sidecar: one run, the answer."""
    async with resumable_server(make_tool, make_sidecar, refuse_gets=1) as (sidecar, cutting, runs):
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            result = await client.call_tool("transfer", {"amount": 5})

    assert result.content[0].text == "sent 5"
    assert runs == [1]
    [call] = wire.tool_calls()
    assert call.status == 200
    assert call.headers["X-Sidecar-Trail"] == "reset stop=not_replayable"
    sidecars, clients = cutting.resumed_after  # the sidecar's, refused; then the client's
    assert sidecars == clients


async def test_a_listen_stream_is_acknowledged_at_once_and_ends_at_the_drain(make_sidecar):
    """MCP 2026-07-28's ``subscriptions/listen``: its acknowledgment reaches the client as it
    is sent (0.5 held it for the inspection window, and the conformance suite's
    ``server-stateless`` gave up), and its stream, which carries no answer to wait for, ends
    after a whole event once the sidecar drains, rather than holding the drain to its end.
    The client hears its subscription end (the SDK re-listens on a replica that serves)."""
    server = MCPServer("lists")

    @server.tool()
    async def echo(text: str) -> str:
        return text

    acknowledged = False
    async with uvicorn_serving(server.streamable_http_app()) as url:
        sidecar = await make_sidecar(url, inspect_timeout_ms=HOLD_MS)
        async with mcp_client(str(sidecar.client.make_url("/mcp")), Wire()) as client:
            with anyio.fail_after(10), pytest.raises(BaseException) as lost:
                async with client.listen(tools_list_changed=True) as subscription:
                    acknowledged = True
                    drained = asyncio.create_task(sidecar.app[PROXY].drain(HOLD_MS / 1000))
                    async for _ in subscription:
                        pass
            await drained

    assert acknowledged
    [ended] = leaf_errors(lost.value)
    assert isinstance(ended, SubscriptionLost)


# --- a session the server forgot, opened again ----------------------------------------------


@dataclass
class Restartable:
    """Relays every request to the server of the moment, as it streams: a ``restart`` sends
    what follows to a fresh server that knows none of the sessions the first one opened,
    as a restarted or rescheduled server does. Counts the methods each one received."""

    urls: list[str]
    http: aiohttp.ClientSession
    current: int = 0
    received: list[list[str]] = field(default_factory=lambda: [[], [], []])
    restart_after: str | None = None  # a method that restarts the server once it is received
    hold_404s: int = (
        0  # 404s held back until this many came, so that they reach the sidecar together
    )
    _held: int = 0
    _all_held: asyncio.Event = field(default_factory=asyncio.Event)

    def restart(self) -> None:
        self.current += 1

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        sent = orjson.loads(body) if body else {}
        method = sent.get("method", request.method)
        self.received[self.current].append(method)
        headers = asked(request)
        url = self.urls[self.current] + request.path_qs
        if method == self.restart_after:
            self.restart_after = None
            self.restart()
        async with self.http.request(request.method, url, data=body, headers=headers) as answer:
            if answer.status == 404 and self.hold_404s:
                self._held += 1
                if self._held >= self.hold_404s:
                    self._all_held.set()
                await self._all_held.wait()
            relayed = await answer_head(request, answer)
            return await relay_rest(relayed, answer)


def echo_server(name: str) -> MCPServer:
    server = MCPServer(name)

    @server.tool()
    async def echo(text: str) -> str:
        return f"{name}: {text}"

    return server


@asynccontextmanager
async def restartable(
    make_tool: Callable[..., Any], second: MCPServer | None = None
) -> AsyncIterator[tuple[Restartable, Any]]:
    """Two servers, the second taking over at ``restart``, behind one relay (a tool)."""
    async with (
        uvicorn_serving(echo_server("first").streamable_http_app()) as first_url,
        uvicorn_serving((second or echo_server("second")).streamable_http_app()) as second_url,
        uvicorn_serving(echo_server("third").streamable_http_app()) as third_url,
        aiohttp.ClientSession() as http,
    ):
        servers = Restartable([first_url, second_url, third_url], http)
        yield servers, await make_tool(servers)


async def test_a_session_the_server_forgot_is_opened_again_and_the_call_runs_once(
    make_tool, make_sidecar
):
    """The server restarts mid-session and answers 404 to the old session: the sidecar
    opens a new one with the agent's own ``initialize``, sends the call once more (the 404
    proved it never ran) and maps the agent's session to the new one from then on. The
    client never learns: it keeps its id, and its next calls and its ``DELETE`` reach the
    new session."""
    async with restartable(make_tool) as (servers, tool):
        sidecar = await make_sidecar(tool)
        wire = Wire()
        with capture_logs() as logs:
            async with mcp_client(
                str(sidecar.client.make_url("/mcp")), wire, mode="legacy"
            ) as client:
                before = await client.call_tool("echo", {"text": "a"})
                servers.restart()
                during = await client.call_tool("echo", {"text": "b"})
                after = await client.call_tool("echo", {"text": "c"})

    assert [r.content[0].text for r in (before, during, after)] == [
        "first: a",
        "second: b",
        "second: c",
    ]
    _, lost, _ = wire.tool_calls()
    assert lost.headers["X-Sidecar-Trail"] == "404 session=reopened, 200"
    assert lost.headers["X-Sidecar-Attempts"] == "2"
    assert lost.headers["X-Sidecar-Outcome"] == "recovered"
    # The second server: the lost call (404), the sidecar's new session, the call again,
    # the next call and the client's DELETE, on the new session.
    assert servers.received[1] == [
        "tools/call",
        "initialize",
        "notifications/initialized",
        "tools/call",
        "tools/call",
        "DELETE",
    ]
    assert (
        sidecar.metric("sidecar_mcp_sessions_reopened_total", route="default", result="reopened")
        == 1
    )
    assert [line["event"] for line in logs if line["event"].startswith("mcp_session")] == [
        "mcp_session_reopened"
    ]


@pytest.mark.parametrize(
    ("restart_after", "second_received"),
    [
        ("initialize", ["tools/call", "initialize"]),
        ("notifications/initialized", ["tools/call", "initialize", "notifications/initialized"]),
    ],
)
async def test_a_session_lost_again_while_it_is_opened_again_is_opened_once_more(
    make_tool, make_sidecar, restart_after, second_received
):
    """The server restarts again while the sidecar opens the new session (its
    ``notifications/initialized`` or the call meets the third server's 404): the call's
    second 404 opens a session on the third server, where the call runs once."""
    async with restartable(make_tool) as (servers, tool):
        sidecar = await make_sidecar(tool)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            await client.call_tool("echo", {"text": "a"})
            servers.restart()
            servers.restart_after = restart_after
            during = await client.call_tool("echo", {"text": "b"})

    assert during.content[0].text == "third: b"
    _, lost = wire.tool_calls()
    assert lost.headers["X-Sidecar-Trail"] == "404 session=reopened, 404 session=reopened, 200"
    assert servers.received[1] == second_received
    opened_on_third = ["initialize", "notifications/initialized", "tools/call", "DELETE"]
    assert servers.received[2][-4:] == opened_on_third
    assert servers.received[2].count("tools/call") == 2  # its 404, then the call that ran
    assert (
        sidecar.metric("sidecar_mcp_sessions_reopened_total", route="default", result="reopened")
        == 2
    )


async def test_requests_that_meet_the_404_together_go_on_one_new_session(make_tool, make_sidecar):
    """Two requests of one agent session meet the restarted server's 404 at once (a client's
    ``GET`` stream and a call, say): the session is opened again once, and both go on it,
    rather than the agent's stream and its calls ending up on two sessions."""
    async with restartable(make_tool) as (servers, tool):
        sidecar = await make_sidecar(tool)
        wire = Wire()
        async with mcp_client(str(sidecar.client.make_url("/mcp")), wire, mode="legacy") as client:
            await client.call_tool("echo", {"text": "a"})
            session = wire.exchanges[0].headers["Mcp-Session-Id"]
            servers.restart()
            servers.hold_404s = 2
            headers = {**MCP_HEADERS, "Mcp-Session-Id": session,
                       "Mcp-Protocol-Version": "2025-11-25"}  # fmt: skip
            calls = [
                {"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call",
                 "params": {"name": "echo", "arguments": {"text": str(n)}}}
                for n in range(2)
            ]  # fmt: skip
            answers = await asyncio.gather(
                *(sidecar.client.post("/mcp", json=call, headers=headers) for call in calls)
            )
            bodies = [await answer.read() for answer in answers]

    assert [answer.status for answer in answers] == [200, 200]
    assert all(b"second: " in body for body in bodies)
    assert servers.received[1].count("initialize") == 1
    assert (
        sidecar.metric("sidecar_mcp_sessions_reopened_total", route="default", result="reopened")
        == 1
    )


async def test_a_session_the_sidecar_never_saw_opened_gets_the_servers_404(make_tool, make_sidecar):
    """A session opened before this sidecar started (no fleet store to ask): nothing to open
    it with, so the agent gets the server's 404 as it came, and a line says so."""
    async with restartable(make_tool) as (servers, tool):
        before = await make_sidecar(tool)
        wire = Wire()
        async with mcp_client(str(before.client.make_url("/mcp")), wire, mode="legacy") as client:
            await client.call_tool("echo", {"text": "a"})
            session = wire.exchanges[0].headers["Mcp-Session-Id"]
        servers.restart()
        after = await make_sidecar(tool)
        with capture_logs() as logs:
            answer = await after.client.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
                headers={**MCP_HEADERS, "Mcp-Session-Id": session},
            )

    assert answer.status == 404
    assert answer.headers["X-Sidecar-Trail"] == "404"
    assert (
        after.metric("sidecar_mcp_sessions_reopened_total", route="default", result="failed") == 1
    )
    assert "mcp_session_lost" in [line["event"] for line in logs]


async def test_another_replica_opens_again_a_session_one_saw_opened(
    make_tool, make_sidecar, redis_store
):
    """With a fleet store, the ``initialize`` a replica relayed is there for the others: the
    agent's next request lands on another replica after the server restarted, and that one
    opens the session again."""
    shared = {"state_url": redis_store.url, "state_timeout_ms": 2000}
    async with restartable(make_tool) as (servers, tool):
        one = await make_sidecar(tool, **shared)
        other = await make_sidecar(tool, **shared)
        wire = Wire()
        async with mcp_client(str(one.client.make_url("/mcp")), wire, mode="legacy") as client:
            await client.call_tool("echo", {"text": "a"})
            session = wire.exchanges[0].headers["Mcp-Session-Id"]
            servers.restart()
            answer = await other.client.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "b"}}},
                headers={**MCP_HEADERS, "Mcp-Session-Id": session,
                         "Mcp-Protocol-Version": "2025-11-25"},
            )  # fmt: skip
            body = await answer.read()

    assert answer.headers["X-Sidecar-Trail"] == "404 session=reopened, 200"
    assert b"second: b" in body
    assert servers.received[1][:3] == ["tools/call", "initialize", "notifications/initialized"]


async def test_a_session_its_agent_ended_is_opened_again_by_no_replica(
    make_tool, make_sidecar, redis_store
):
    """The agent's ``DELETE`` ends the session in the fleet store too: a straggling request
    on it, on another replica after a restart, gets the server's 404 rather than a new
    session nobody will end."""
    shared = {"state_url": redis_store.url, "state_timeout_ms": 2000}
    async with restartable(make_tool) as (servers, tool):
        one = await make_sidecar(tool, **shared)
        other = await make_sidecar(tool, **shared)
        wire = Wire()
        async with mcp_client(str(one.client.make_url("/mcp")), wire, mode="legacy") as client:
            await client.call_tool("echo", {"text": "a"})
            session = wire.exchanges[0].headers["Mcp-Session-Id"]
        servers.restart()  # the client's DELETE went first, as it left
        answer = await other.client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
            headers={**MCP_HEADERS, "Mcp-Session-Id": session,
                     "Mcp-Protocol-Version": "2025-11-25"},
        )  # fmt: skip

    assert answer.status == 404
    assert "initialize" not in servers.received[1]


@dataclass
class SessionServer:
    """A streamable-HTTP server reduced to its sessions: ``initialize`` opens ``s-1``,
    ``s-2``…, held while ``opening`` is clear; after ``restart`` the sessions opened before
    it get ``404``; a ``DELETE`` is answered ``200`` whatever it names, as a server that
    ends sessions without checking them does."""

    opened: int = 0
    forgotten_up_to: int = 0
    opening: asyncio.Event = field(default_factory=asyncio.Event)
    initialize_arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.opening.set()

    def restart(self) -> None:
        self.forgotten_up_to = self.opened

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            return web.Response(status=200)
        sent = orjson.loads(await request.read())
        if sent.get("method") == "initialize":
            self.initialize_arrived.set()
            await self.opening.wait()
            self.opened += 1
            answer = {"jsonrpc": "2.0", "id": sent["id"], "result": {}}
            return web.json_response(answer, headers={"Mcp-Session-Id": f"s-{self.opened}"})
        number = int(request.headers["Mcp-Session-Id"].removeprefix("s-"))
        if number <= self.forgotten_up_to:
            return web.json_response({"jsonrpc": "2.0", "error": {}}, status=404)
        if "id" not in sent:
            return web.Response(status=202)
        return web.json_response({"jsonrpc": "2.0", "id": sent["id"], "result": {"on": number}})


def on_session(session: str, **extra: str) -> dict[str, str]:
    return {**MCP_HEADERS, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25", **extra}


CALL = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "x"}}


async def test_a_session_its_agent_ends_while_it_is_opened_again_stays_ended(
    make_tool, make_sidecar
):
    """The agent's ``DELETE`` is answered while one of its requests is opening the session
    again: the new session is not kept, so neither that request nor a straggler after the
    ``DELETE`` goes on a session the agent ended (it would never be ended at the server)."""
    server = SessionServer()
    sidecar = await make_sidecar(await make_tool(server))
    opened = await sidecar.client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    assert opened.headers["Mcp-Session-Id"] == "s-1"
    server.restart()
    server.opening.clear()
    server.initialize_arrived.clear()
    call = asyncio.create_task(sidecar.client.post("/mcp", json=CALL, headers=on_session("s-1")))
    await server.initialize_arrived.wait()
    ended = await sidecar.client.delete("/mcp", headers=on_session("s-1"))
    server.opening.set()
    lost = await call
    straggler = await sidecar.client.post("/mcp", json=CALL, headers=on_session("s-1"))

    assert ended.status == 200
    assert (lost.status, straggler.status) == (404, 404)
    assert server.opened == 2  # the one opened again, and left
    # Failed: the request that opened it, and the straggler, with nothing to open it with.
    metric = sidecar.metric
    assert metric("sidecar_mcp_sessions_reopened_total", route="default", result="failed") == 2


async def test_a_request_that_only_waited_for_the_session_to_open_counts_no_failure(
    make_tool, make_sidecar
):
    """A request whose deadline ends while another request of its session opens it again
    gives up, but opened nothing: the session is counted once, as opened again."""
    server = SessionServer()
    sidecar = await make_sidecar(await make_tool(server))
    await sidecar.client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    server.restart()
    server.opening.clear()
    server.initialize_arrived.clear()
    opener = asyncio.create_task(sidecar.client.post("/mcp", json=CALL, headers=on_session("s-1")))
    await server.initialize_arrived.wait()
    waiter = await sidecar.client.post(
        "/mcp", json={**CALL, "id": 6}, headers=on_session("s-1", **{"X-Sidecar-Timeout-Ms": "300"})
    )
    server.opening.set()
    reopened = await opener

    assert reopened.status == 200 and (await reopened.json())["result"] == {"on": 2}
    # Its deadline ended the wait: the agent gets the server's real 404.
    assert (waiter.status, waiter.headers["X-Sidecar-Trail"]) == (404, "404")
    metric = sidecar.metric
    assert metric("sidecar_mcp_sessions_reopened_total", route="default", result="reopened") == 1
    assert metric("sidecar_mcp_sessions_reopened_total", route="default", result="failed") == 0
