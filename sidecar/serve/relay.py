"""The tool's answer, relayed to the agent as it came."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import NamedTuple

import structlog

from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.tool.eventstream import AnswerReader
from sidecar.transport.exchange import Answer, BodyBroken
from sidecar.wire.headers import end_to_end_headers

_log = structlog.get_logger("sidecar")


class StreamTerms(NamedTuple):
    """How long an event stream may go on, and when the sidecar ends it (after a whole
    event, so that its reader loses nothing and an MCP client can resume it).

    A call's stream still owed its answer (``answer_due``) lives while its server shows it
    is there: at most ``idle_s`` (the per-try timeout) without an event, each event
    starting it again, and until ``until`` (loop time) in all. Every other stream (the
    answer came; a ``GET`` stream; an MCP ``subscriptions/listen``) lives as long as its
    server keeps it, and ends once ``ending`` is set (the process drains)."""

    ending: asyncio.Event
    answer_due: bool
    idle_s: float
    until: float
    until_is_deadline: bool = False  # ``until`` is the request's deadline, not the maximum


async def relay(
    request: AgentRequest,
    answer: Answer,
    report: Mapping[str, str],
    stream: StreamTerms | None = None,
) -> AgentReply:
    """The tool's status, reason, headers and body bytes as they came, plus ``report``.

    Hop-by-hop headers and any ``X-Sidecar-*`` header of the tool's (which could pass for
    the sidecar's own report) are dropped. A body read whole goes out with its length;
    the rest streams, keeping the tool's ``Content-Length`` when it sent one. If the tool
    breaks off mid-stream the agent's connection is closed too, so a cut body can never
    pass for a whole one. An event stream (``stream``) ends as ``StreamTerms`` says, and
    one that broke after an event with an id ends after its last whole event instead: its
    reader drops a part event at the end as it would at a break, and resumes.
    """
    headers = end_to_end_headers(answer.response.headers, drop_control=True)
    headers.update(report)
    if answer.complete:
        # Headers and body leave in one write, with the body's length.
        answer.discard()
        headers.popall("Content-Length", None)
        return AgentReply(answer.status, answer.response.reason, headers, answer.body)
    reply = AgentReply(answer.status, answer.response.reason, headers, sent=True)
    try:
        reply = await request.start_answer(answer.status, answer.response.reason, headers)
        await request.write_body(answer.body)
        if stream is not None:
            cut = await _relay_events(request, answer, stream)
            if cut is not None:
                reply.force_close()  # its agent reconnects, here or elsewhere
                if not cut:
                    request.close_connection()  # cut inside an event: no clean end
                    return reply
        else:
            async for chunk in answer.rest():
                await request.write_body(chunk)
        await request.end_answer()
    except ConnectionError:
        _log.debug("client_disconnected", status=answer.status)
        reply.force_close()
    except BodyBroken as broken:
        _log.warning("upstream_stream_broken", status=answer.status, reason=str(broken))
        request.close_connection()
        reply.force_close()
    finally:
        answer.discard()
    return reply


async def _relay_events(request: AgentRequest, answer: Answer, terms: StreamTerms) -> bool | None:
    """The rest of an event stream, until it is over (``None``) or the sidecar ends it:
    ``True`` to end it cleanly (after a whole event, or after a break its agent's client
    resumes from), ``False`` to cut it (inside an event).

    A call's stream is over when its server ends it, and one the sidecar resumed when its
    answer has gone: the ``GET`` it came on is the sidecar's, and a server may keep that
    open after its replay (the TypeScript SDK's does) where the call's own stream ends
    with its answer."""
    # A stream no call waits on is only followed: where its events end, and their ids.
    reader = answer.reader or AnswerReader(None, 0)
    if answer.reader is None:
        reader.feed(answer.body)
    scanner, waiting = reader.scanner, terms.answer_due
    loop = asyncio.get_running_loop()
    idle_at, events = loop.time() + terms.idle_s, scanner.events
    chunks = answer.rest()
    ended = asyncio.ensure_future(terms.ending.wait())
    arriving: asyncio.Future[bytes] | None = None
    try:
        while True:
            if answer.resumed and not waiting and scanner.at_boundary:
                return None
            arriving = asyncio.ensure_future(anext(chunks, b""))
            if waiting or scanner.at_boundary:
                # Owed its answer, a call's stream may run out of time; between events,
                # any other stream may end at the drain: whichever comes first.
                timeout = min(idle_at, terms.until) - loop.time() if waiting else None
                waits = (arriving,) if waiting else (arriving, ended)
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not arriving.done():
                    await _abandon(arriving)
                    why = (
                        "drain"
                        if not waiting
                        else "idle"
                        if idle_at <= terms.until
                        else ("deadline" if terms.until_is_deadline else "max")
                    )
                    _log.info("upstream_stream_ended", status=answer.status, reason=why)
                    return scanner.at_boundary
            chunk = await arriving
            if not chunk:
                return None
            if reader.feed(chunk) is not None:
                waiting = False  # the answer: the stream may end with the drain now
            if scanner.events != events:
                idle_at, events = loop.time() + terms.idle_s, scanner.events
            await request.write_body(chunk)
    except BodyBroken as broken:
        if scanner.last_event_id is None:
            raise
        # What the agent got ends after its last whole event: its client resumes from there.
        _log.warning("upstream_stream_broken", status=answer.status, reason=str(broken))
        return True
    finally:
        ended.cancel()
        # Cancelled while waiting (the agent left): the read in flight goes too, or the
        # tool's broken stream it ends in is an error nobody retrieves.
        if arriving is not None and not arriving.done():
            arriving.cancel()


async def _abandon(arriving: asyncio.Future[bytes]) -> None:
    """A read no longer wanted, cancelled and waited for."""
    arriving.cancel()
    await asyncio.wait((arriving,))
    if not arriving.cancelled():
        arriving.exception()  # the tool's stream broke meanwhile: moot
