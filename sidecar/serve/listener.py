"""The proxy's listening sockets: every connection waiting is accepted at each wake-up.

Since libuv 1.45, uvloop's servers accept one connection per turn of the loop, and a
turn of a busy sidecar runs every ready agent's and tool's callbacks first. Sixty-four
agents that connected at once while others were being served so waited up to 0.8 s for
their accept (the p99 at c=64 in docs/performance.md). asyncio's own loop and
Envoy accept until the queue is empty; so does this, on either loop, and hands each
connection to the loop's own transport.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import socket
from collections.abc import Callable

# Out of descriptors or memory, accepting waits this long before it tries again (the
# connections stay queued meanwhile), as asyncio's own servers do.
_ACCEPT_RETRY_S = 1.0
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Listener:
    """Listening sockets whose waiting connections are accepted, up to ``batch`` at a
    wake-up, each given to ``protocol_factory``'s protocol on the loop's transport."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol_factory: Callable[[], asyncio.Protocol],
        sockets: list[socket.socket],
        batch: int,
    ) -> None:
        self._loop = loop
        self._protocol_factory = protocol_factory
        self._sockets = sockets
        self._batch = batch
        self._handing_over: set[asyncio.Task[object]] = set()
        for listening in sockets:
            loop.add_reader(listening.fileno(), self._accept, listening)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def close(self) -> None:
        """Stop listening. Connections not yet handed to a transport go as those still in
        the kernel's queue do: closed, never answered by a server that is shutting down."""
        for listening in self._sockets:
            self._loop.remove_reader(listening.fileno())
            listening.close()
        self._sockets = []
        for handover in list(self._handing_over):
            handover.cancel()

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(self._batch):
            try:
                connection, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the agent gave up while it waited in the queue
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                self._loop.call_exception_handler(
                    {"message": "socket.accept() out of system resource", "exception": exc}
                )
                self._loop.remove_reader(listening.fileno())
                self._loop.call_later(_ACCEPT_RETRY_S, self._resume, listening)
                return
            connection.setblocking(False)
            handover = self._loop.create_task(
                self._loop.connect_accepted_socket(self._protocol_factory, connection)
            )
            # Held until done: the loop keeps only a weak reference to a task.
            self._handing_over.add(handover)
            handover.add_done_callback(functools.partial(self._handed_over, connection))

    def _handed_over(self, connection: socket.socket, handover: asyncio.Task[object]) -> None:
        self._handing_over.discard(handover)
        if not handover.cancelled() and handover.exception() is None:
            return
        connection.close()
        if handover.cancelled():
            return
        # Said, as asyncio's own servers do with a transport they cannot make.
        self._loop.call_exception_handler(
            {
                "message": "Error on transport creation for incoming connection",
                "exception": handover.exception(),
            }
        )

    def _resume(self, listening: socket.socket) -> None:
        if listening in self._sockets:
            self._loop.add_reader(listening.fileno(), self._accept, listening)


async def bound_sockets(
    loop: asyncio.AbstractEventLoop, host: str, port: int, backlog: int
) -> list[socket.socket]:
    """A listening socket on each address ``host`` names, bound as asyncio binds them:
    addresses reusable at once after a restart, and IPv6 ones for IPv6 only."""
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            listening = socket.socket(family, kind, proto)
            sockets.append(listening)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listening.bind(address)
            listening.listen(backlog)
            listening.setblocking(False)
    except BaseException:
        for listening in sockets:
            listening.close()
        raise
    return sockets
