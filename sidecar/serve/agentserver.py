"""The agent-facing server as aiohttp's runners and sites know it: it makes one
``AgentConnection`` (``httpserver``) per agent connection and drains them on shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.serve.httpserver import AgentConnection
from sidecar.wire.buffers import BufferBudget

ProxyHandler = Callable[[AgentRequest], Awaitable[AgentReply]]


class ProxyServer(web.Server):
    """aiohttp's low-level server as its runners and sites know it, serving the proxy's
    agents on the protocol below."""

    def __init__(
        self,
        handler: ProxyHandler,
        *,
        client_timeout_s: float,
        max_line_size: int,
        max_field_size: int,
        lingering_s: float,
        logger: logging.Logger,
        buffers: BufferBudget,
    ) -> None:
        super().__init__(handler)  # type: ignore[arg-type]  # the handler takes our request
        self.proxy_handler = handler
        self.client_timeout_s = client_timeout_s
        self.max_line_size = max_line_size
        self.max_field_size = max_field_size
        self.lingering_s = lingering_s
        self.logger = logger
        self.buffers = buffers
        self.agents: set[AgentConnection] = set()

    def __call__(self) -> AgentConnection:  # type: ignore[override]  # not aiohttp's protocol
        return AgentConnection(self)

    def pre_shutdown(self) -> None:
        for agent in list(self.agents):
            agent.close_when_idle()

    # The runner calls this with aiohttp's signature.
    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await asyncio.gather(*(agent.shutdown(timeout) for agent in list(self.agents)))
        self.agents.clear()
