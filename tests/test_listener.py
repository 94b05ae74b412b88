"""The proxy's listener accepts every waiting connection at one wake-up, on either loop.

libuv, under uvloop, accepts one connection per turn of the loop: agents that connect
together while the sidecar is busy wait a turn each. These tests count turns, not time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import uvloop

from sidecar.serve.agentserver import AgentServer
from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.serve.listener import Listener
from sidecar.wire.buffers import BufferBudget

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
BURST = 64
T = TypeVar("T")


def _loopback_listener(
    protocol_factory: Callable[[], asyncio.Protocol],
) -> tuple[Listener, socket.socket]:
    """A ``Listener`` on a free port of 127.0.0.1, and its socket."""
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    loop = asyncio.get_running_loop()
    return Listener(loop, protocol_factory, [listening], batch=16), listening


def _on(new_loop: Callable[[], asyncio.AbstractEventLoop], work: Coroutine[Any, Any, T]) -> T:
    """``work`` run to its end on a loop of ``new_loop``'s kind."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(work)


async def _answer(request: AgentRequest) -> AgentReply:
    return AgentReply(200, body=b"ok")


@contextlib.asynccontextmanager
async def _serving(port: int = 0) -> AsyncIterator[tuple[AgentServer, int]]:
    """An agent server listening on ``port`` of 127.0.0.1, and its port."""
    server = AgentServer(
        _answer,
        client_timeout_s=60.0,
        max_header_bytes=8190,
        lingering_s=1.0,
        logger=logging.getLogger("test"),
        buffers=BufferBudget(2**24),
    )
    await server.start("127.0.0.1", port, backlog=128)
    try:
        yield server, server.port
    finally:
        await server.close(grace_s=1.0)


async def _burst_accepted_within_turns() -> int:
    """Turns of the loop, after the first agent's connection was taken on, that the
    rest of a burst of agents waited."""
    async with _serving() as (server, port):
        # Blocking connects: the kernel completes each handshake into the listen queue
        # before the loop runs again, so all of them wait there together.
        agents = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]
        try:
            for _ in range(100):
                if server.agents:
                    break
                await asyncio.sleep(0)
            turns = 0
            while len(server.agents) < BURST and turns < 100:
                await asyncio.sleep(0)
                turns += 1
            return turns
        finally:
            for agent in agents:
                agent.close()


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_agents_connecting_together_are_all_taken_on_in_one_turn(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    assert _on(new_loop, _burst_accepted_within_turns()) <= 1


async def _answers_then_refuses_once_stopped() -> tuple[bytes, type[OSError] | None]:
    async with _serving() as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        server.stop_listening()
        refused: type[OSError] | None = None
        try:
            await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            refused = type(exc)
        return answer.split(b"\r\n", 1)[0], refused


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_a_server_answers_and_stops_listening_when_told(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    status_line, refused = _on(new_loop, _answers_then_refuses_once_stopped())
    assert status_line == b"HTTP/1.1 200 OK"
    assert refused is ConnectionRefusedError


def test_a_port_in_use_is_refused_with_its_errno() -> None:
    async def bind_twice() -> None:
        async with _serving() as (_, port), _serving(port):
            pass

    with pytest.raises(OSError) as refused:
        asyncio.run(bind_twice())
    assert refused.value.errno == errno.EADDRINUSE


async def _a_protocol_that_cannot_be_made() -> tuple[bytes, list[str]]:
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))

    def refuse() -> asyncio.Protocol:
        raise RuntimeError("no protocol")

    listener, listening = _loopback_listener(refuse)
    try:
        reader, writer = await asyncio.open_connection(*listening.getsockname())
        ended = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
        return ended, reported
    finally:
        listener.close()


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_a_connection_that_cannot_be_served_is_closed_and_reported(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    ended, reported = _on(new_loop, _a_protocol_that_cannot_be_made())
    assert ended == b""
    assert reported == ["Error on transport creation for incoming connection"]


async def _closed_between_accept_and_handover() -> tuple[bytes, int]:
    served: list[asyncio.BaseTransport] = []

    class Served(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            served.append(transport)

    listener, listening = _loopback_listener(Served)
    agent = socket.create_connection(listening.getsockname())
    try:
        # What the loop does when the socket is ready, then a stop before the handover
        # runs: the moment a drain can fall in.
        listener._accept(listening)
        listener.close()
        for _ in range(5):
            await asyncio.sleep(0)
        agent.settimeout(5)
        return agent.recv(16), len(served)
    finally:
        agent.close()


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_a_connection_accepted_as_the_port_stops_is_closed_not_served(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    ended, served = _on(new_loop, _closed_between_accept_and_handover())
    assert (ended, served) == (b"", 0)
