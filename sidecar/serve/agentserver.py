"""The agent-facing server, as uvicorn's ``Server`` owns its sockets and protocols: the
listening sockets (``listener``), one ``AgentConnection`` (``httpserver``) per agent, and
their end, started and closed as one. No aiohttp runner or site stands between: aiohttp
keeps the admin port."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.serve.httpserver import AgentConnection
from sidecar.serve.listener import Listener, bound_sockets
from sidecar.wire.buffers import BufferBudget

Handler = Callable[[AgentRequest], Awaitable[AgentReply]]


class AgentServer:
    """Serves the proxy's agents: ``start`` listens, ``stop_listening`` takes no one new,
    ``close`` lets the answers under way finish for a grace time, then cuts them."""

    def __init__(
        self,
        handler: Handler,
        *,
        client_timeout_s: float,
        max_header_bytes: int,
        lingering_s: float,
        logger: logging.Logger,
        buffers: BufferBudget,
    ) -> None:
        self.handler = handler
        self.client_timeout_s = client_timeout_s
        # The request line and each header line may be as long as the whole section's
        # limit; a header line's is one byte more, so that a line over it tells which limit
        # was passed (414 or 431), and the section's total catches that byte.
        self.max_header_bytes = max_header_bytes
        self.max_line_size = max_header_bytes
        self.max_field_size = max_header_bytes + 1
        self.lingering_s = lingering_s
        self.logger = logger
        self.buffers = buffers
        self.agents: set[AgentConnection] = set()
        self._listener: Listener | None = None

    async def start(self, host: str, port: int, *, backlog: int) -> None:
        """Listen on every address ``host`` names (``port`` 0: any free one). Each wake-up
        accepts up to ``backlog`` waiting agents."""
        loop = asyncio.get_running_loop()
        sockets = await bound_sockets(loop, host, port, backlog)
        self._listener = Listener(loop, self._connection, sockets, backlog)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return self._listener.sockets if self._listener is not None else ()

    @property
    def port(self) -> int:
        """The port listened on (the one bound, when 0 asked for any)."""
        return int(self.sockets[0].getsockname()[1])

    def stop_listening(self) -> None:
        """Take no new agent; those connected go on."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def close(self, grace_s: float) -> None:
        """Stop listening; an idle connection closes now, one answering gets ``grace_s`` to
        finish its answer and is then cut."""
        self.stop_listening()
        # As aiohttp's runner does: one turn of the loop, so that bytes an idle connection
        # has already received are read (a request taken on) before idle ones are closed.
        await asyncio.sleep(0)
        for agent in list(self.agents):
            agent.close_when_idle()
        await asyncio.gather(*(agent.shutdown(grace_s) for agent in list(self.agents)))
        self.agents.clear()

    def _connection(self) -> AgentConnection:
        return AgentConnection(self)
