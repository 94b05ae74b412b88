"""A counting fault tap in front of an MCP streamable-HTTP server: what the tool received.

Every request is relayed to the server as it came and its answer back as it came (event
streams chunk by chunk); a tap used as a recorder can give each request without an
``X-Request-ID`` one (``request_ids``), and be told of each relayed answer's head
(``on_answer``). Each POST that reaches the server is counted by its JSON-RPC method
and, for ``tools/call``, its tool; a call whose request (same session, same JSON-RPC id) is
delivered twice was run twice. GETs, DELETEs and the rest are counted by method
(``Tally.others``); a GET with ``Last-Event-ID`` (a stream resumed) is relayed untouched,
unless ``session-lost`` (below) forgot its session, and each one relayed to the server is
counted in ``Tally.resumed`` by who sent it: ``proxy`` when it carries the ``X-Request-ID``
of a POST whose stream the tap cut (the sidecar resumes a stream with the call's own
headers; a client's own GET gets a request id of its own from the sidecar or Envoy on the
way, and has none without a proxy: none of the clients here sends one), ``client``
otherwise. On POSTs the tap can also play one fault, on each POST it applies to
drawn from a seeded RNG, or on the first attempt of every Nth call of some tools:

- ``reset-before``: the request is read, then the connection is reset (RST): the server never
  saw it.
- ``reset-after``: the request is delivered, the server's whole answer read, then the
  connection is reset: the server ran it, the caller got nothing.
- ``rpc-error``: a ``tools/call`` is answered by the tap, not delivered, with a 200 holding
  ``{"code": -32603, "data": {"retryable": true}}``, framed as the server frames its answers:
  an event stream that opens with a priming event (an ``id:`` and an empty ``data:``, as a
  server with an event store sends under protocol 2025-11-25), or plain JSON when the caller
  does not accept event streams. Every other POST passes (the tool's error is a tool call's).
- ``rpc-error-json``: the same error as plain JSON whatever the caller accepts, as a server
  that answers in JSON (the MCP SDK's ``json_response=True``) sends it.
- ``cut-after-event``: a ``tools/call`` is delivered and the server's whole answer read (so
  the server ran it, and a server with an event store holds its answer event); then only
  the answer's head and its first whole event are relayed (a server with an event store,
  under protocol 2025-11-25, opens the stream with a priming event: an ``id:`` and an empty
  ``data:``), and the connection is reset (RST) inside the chunked body: a stream cut after
  an event with an id, which a client (or a proxy) can resume with ``GET`` and
  ``Last-Event-ID``. An answer that is not an event stream, or holds no whole event, is
  relayed whole and not counted as a fault. Every other POST passes.
- ``session-lost``: the server forgets its sessions for good, as one that restarted (or
  expired them) does. Each POST other than ``initialize`` that names a session the server
  still knows (``Mcp-Session-Id``) draws; on a hit the server "restarts" at that POST: every
  session the tap has seen is unknown from then on. That POST and every later request
  naming one of them, POST, GET or DELETE, is answered by the tap and never delivered, as
  the MCP Python SDK's server answers an unknown session: ``404`` with the JSON-RPC error
  ``{"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "Session not
  found"}}`` (the TypeScript SDK's transport answers 404 too, with code ``-32001``). A
  session opened afterwards (a new ``initialize``) is known until the next hit. Only POSTs
  of known sessions draw, in the order they arrive, so a seed gives the same restarts to the
  same sequence of POSTs; ``Tally.not_found`` counts the 404s, ``faults["session-lost"]`` the
  restarts. (server-everything's own express app answers a session it does not know with
  ``400`` "Bad Request: No valid session ID provided", against the specification's 404; the
  tap plays the specification's answer, which clients are written against.)
"""

from __future__ import annotations

import random
import socket
import struct
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

FAULTS = (
    "reset-before",
    "reset-after",
    "rpc-error",
    "rpc-error-json",
    "cut-after-event",
    "session-lost",
)
# The faults played on tools/call requests only.
_ON_TOOL_CALLS = frozenset({"rpc-error", "rpc-error-json", "cut-after-event"})
# Hop-by-hop and framing headers: aiohttp writes its own for what the tap relays.
_NOT_RELAYED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)
RETRYABLE_ERROR = {"code": -32603, "message": "Internal error", "data": {"retryable": True}}
# The MCP Python SDK's answer to a session it does not know (streamable_http_manager.py).
SESSION_NOT_FOUND = orjson.dumps(
    {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
)


@dataclass
class Delivery:
    """One POST the server received."""

    session: str
    rpc_id: object  # None for a notification
    method: str
    tool: str | None  # the tool of a tools/call
    task: str  # the caller's x-bench-task header: which task sent it


@dataclass
class Tally:
    """What the tool received, and what the tap did."""

    deliveries: list[Delivery] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    not_found: int = 0  # requests answered 404 for a session the server forgot
    # Requests other than POSTs that reached the tap: "GET", "GET Last-Event-ID" (a stream
    # resumed), "DELETE".
    others: Counter[str] = field(default_factory=Counter)
    # GETs with Last-Event-ID relayed to the server, by who sent them: "proxy" (the request
    # id of a POST the tap cut) or "client".
    resumed: Counter[str] = field(default_factory=Counter)

    def by_method(self) -> Counter[str]:
        return Counter(f"{d.method}:{d.tool}" if d.tool else d.method for d in self.deliveries)

    def calls_run_twice(self) -> list[Delivery]:
        """Each tools/call the server received more than once (same session, same id)."""
        seen: Counter[tuple[str, str]] = Counter()
        twice: list[Delivery] = []
        for delivery in self.deliveries:
            if delivery.method != "tools/call":
                continue
            key = (delivery.session, orjson.dumps(delivery.rpc_id).decode())
            seen[key] += 1
            if seen[key] == 2:
                twice.append(delivery)
        return twice


# Whether to play the fault on one POST: its session and its JSON-RPC message.
Decide = Callable[[str, object], bool]
# Told of each answer the tap relays as it comes, once its head arrived: the request, its
# body and the answer (whose body is still to come).
OnAnswer = Callable[[web.Request, bytes, aiohttp.ClientResponse], None]


def seeded(ratio: float, seed: int) -> Decide:
    """A fault on each POST with probability ``ratio``, from its own seeded RNG."""
    draws = random.Random(seed)
    return lambda session, message: draws.random() < ratio


def first_attempts(nth: int, tools: frozenset[str]) -> Decide:
    """A fault on the first attempt of the Nth, 2Nth, ... call of ``tools``; none on a later
    attempt of the same call (same session, same id). The calls that meet a fault are the
    same whatever a proxy retries."""
    calls: dict[tuple[str, str], bool] = {}

    def decide(session: str, message: object) -> bool:
        if not isinstance(message, dict) or _tool(message) not in tools:
            return False
        call = (session, orjson.dumps(message.get("id")).decode())
        if call in calls:
            return False
        calls[call] = (len(calls) + 1) % nth == 0
        return calls[call]

    return decide


@dataclass
class Tap:
    upstream: str
    fault: str | None = None  # one of FAULTS, or None
    decide: Decide = field(default=lambda session, message: False)
    tally: Tally = field(default_factory=Tally)
    on_answer: OnAnswer | None = None
    request_ids: bool = False  # give each request relayed an X-Request-ID unless it has one
    _client: aiohttp.ClientSession | None = None
    _sessions: set[str] = field(default_factory=set)  # every session named so far
    _forgotten: set[str] = field(default_factory=set)  # those a "restart" forgot
    _cut: set[str] = field(default_factory=set)  # X-Request-IDs of the POSTs whose stream was cut

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        message = _json_rpc(body) if request.method == "POST" else None
        session = request.headers.get("mcp-session-id", "")
        if request.method != "POST":
            resumed = " Last-Event-ID" if "last-event-id" in request.headers else ""
            self.tally.others[request.method + resumed] += 1
        if self.fault == "session-lost" and session and self._session_lost(session, message):
            self.tally.not_found += 1
            return web.Response(status=404, body=SESSION_NOT_FOUND, content_type="application/json")
        if request.method != "POST":
            if request.method == "GET" and "last-event-id" in request.headers:
                request_id = request.headers.get("x-request-id", "")
                self.tally.resumed["proxy" if request_id in self._cut else "client"] += 1
            return await self._relay(request, body)
        eligible = self.fault not in (None, "session-lost") and (
            self.fault not in _ON_TOOL_CALLS or _is_tool_call(message)
        )
        fault = self.fault if eligible and self.decide(session, message) else None
        if fault and fault != "cut-after-event":  # that one counts once it is played
            self.tally.faults[fault] += 1
        if fault == "reset-before":
            reset_connection(request)
            return web.Response()  # never written: the connection is gone
        if fault in ("rpc-error", "rpc-error-json"):
            return _rpc_error(request, message, streamed=fault == "rpc-error")
        self._count(request, message)
        if fault == "cut-after-event":
            return await self._cut_after_event(request, body)
        if fault == "reset-after":
            async with self._forward(request, body) as answer:
                await answer.read()
            reset_connection(request)
            return web.Response()
        return await self._relay(request, body)

    def _session_lost(self, session: str, message: object) -> bool:
        """Whether the server no longer knows ``session``: forgotten by an earlier restart,
        or by one drawn on this POST (not an ``initialize``)."""
        if session in self._forgotten:
            return True
        self._sessions.add(session)
        if (
            message is None
            or (isinstance(message, dict) and message.get("method") == "initialize")
            or not self.decide(session, message)
        ):
            return False
        self.tally.faults["session-lost"] += 1
        self._forgotten |= self._sessions
        return True

    def _count(self, request: web.Request, message: object) -> None:
        if not isinstance(message, dict):
            return
        self.tally.deliveries.append(
            Delivery(
                request.headers.get("mcp-session-id", ""),
                message.get("id"),
                str(message.get("method", "(answer)")),
                _tool(message),
                request.headers.get("x-bench-task", ""),
            )
        )

    @asynccontextmanager
    async def _forward(
        self, request: web.Request, body: bytes
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        assert self._client is not None
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in _NOT_RELAYED
        }
        if self.request_ids and "x-request-id" not in request.headers:
            headers["X-Request-ID"] = uuid.uuid4().hex
        async with self._client.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        ) as answer:
            yield answer

    async def _cut_after_event(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """The server's whole answer read, then its head and first whole event relayed and
        the connection reset; an answer that is no event stream, or holds no whole event,
        relayed whole."""
        async with self._forward(request, body) as answer:
            status, reason, headers = answer.status, answer.reason, answer.headers.copy()
            streamed = answer.content_type == "text/event-stream"
            content = await answer.read()
        end = _first_event_end(content) if streamed else None
        relayed = web.StreamResponse(status=status, reason=reason)
        for name, value in headers.items():
            if name.lower() not in _NOT_RELAYED:
                relayed.headers.add(name, value)
        if end is None:
            relayed.content_length = len(content)
            await relayed.prepare(request)
            await relayed.write(content)
            await relayed.write_eof()
            return relayed
        self.tally.faults["cut-after-event"] += 1
        if "x-request-id" in request.headers:
            self._cut.add(request.headers["x-request-id"])
        await relayed.prepare(request)  # chunked: the reset leaves its body unfinished
        await relayed.write(content[:end])
        reset_connection(request)
        return relayed

    async def _relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        async with self._forward(request, body) as answer:
            if self.on_answer is not None:
                self.on_answer(request, body, answer)
            relayed = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                if name.lower() not in _NOT_RELAYED:
                    relayed.headers.add(name, value)
            if answer.content_length is not None:
                relayed.content_length = answer.content_length
            await relayed.prepare(request)
            async for chunk in answer.content.iter_any():
                await relayed.write(chunk)
            await relayed.write_eof()
            return relayed


def _json_rpc(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _first_event_end(stream: bytes) -> int | None:
    """Where the first whole event of an event stream ends (past its blank line), if it
    holds one, its lines all ending alike (CRLF, LF or CR)."""
    ends = [
        found + len(blank)
        for blank in (b"\r\n\r\n", b"\n\n", b"\r\r")
        if (found := stream.find(blank)) != -1
    ]
    return min(ends) if ends else None


def _tool(message: dict[str, object]) -> str | None:
    """The tool a ``tools/call`` names."""
    params = message.get("params")
    if message.get("method") != "tools/call" or not isinstance(params, dict):
        return None
    return str(params.get("name"))


def _is_tool_call(message: object) -> bool:
    return isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message


def _rpc_error(request: web.Request, message: object, streamed: bool) -> web.Response:
    assert isinstance(message, dict)
    error = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "error": RETRYABLE_ERROR})
    headers = {}
    if "mcp-session-id" in request.headers:
        headers["mcp-session-id"] = request.headers["mcp-session-id"]
    if not streamed or "text/event-stream" not in request.headers.get("Accept", ""):
        return web.Response(body=error, content_type="application/json", headers=headers)
    # The server's own framing: a priming event, then the answer as an event of its stream.
    stream = (
        f"id: {uuid.uuid4()}\ndata: \n\n"
        f"event: message\nid: {uuid.uuid4()}\ndata: {error.decode()}\n\n"
    ).encode()
    headers["Cache-Control"] = "no-cache"
    return web.Response(body=stream, content_type="text/event-stream", headers=headers)


def reset_connection(request: web.Request) -> None:
    """Close the connection with a TCP RST (linger 0), answering nothing."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@asynccontextmanager
async def tap_serving(tap: Tap, port: int = 0) -> AsyncIterator[str]:
    """The tap on 127.0.0.1 (``port``, or a free one); its base URL."""
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{path:.*}", tap.handle)
    # An agent that leaves an event stream ends the tap's relay of it, and so the server's.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as client:
        tap._client = client
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()
