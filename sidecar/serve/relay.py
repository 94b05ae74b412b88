"""The tool's answer, relayed to the agent as it came."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from sidecar.serve.agentwire import AgentReply, AgentRequest
from sidecar.serve.sse import EventBoundary, is_event_stream
from sidecar.transport.exchange import Answer, BodyBroken
from sidecar.transport.headers import end_to_end_headers

_log = structlog.get_logger("sidecar")


async def relay(
    request: AgentRequest,
    answer: Answer,
    report: Mapping[str, str],
    ending: asyncio.Event | None = None,
) -> AgentReply:
    """The tool's status, reason, headers and body bytes as they came, plus ``report``.

    Hop-by-hop headers and any ``X-Sidecar-*`` header of the tool's (which could pass for
    the sidecar's own report) are dropped. A body read whole goes out with its length;
    the rest streams, keeping the tool's ``Content-Length`` when it sent one. If the tool
    breaks off mid-stream the agent's connection is closed too, so a cut body can never
    pass for a whole one. An event stream ends early, after a whole event, once
    ``ending`` is set (the process drains): its agent reconnects elsewhere.
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
        if ending is not None and is_event_stream(answer.response.content_type):
            if not await _relay_events(request, answer, ending):
                reply.force_close()  # the process drains: the agent reconnects elsewhere
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


async def _relay_events(request: AgentRequest, answer: Answer, ending: asyncio.Event) -> bool:
    """The rest of an event stream, until the tool ends it or, once ``ending`` is set, the
    next event boundary; whether the tool ended it."""
    boundary = EventBoundary()
    boundary.feed(answer.body)
    chunks = answer.rest()
    ended = asyncio.ensure_future(ending.wait())
    arriving: asyncio.Future[bytes] | None = None
    try:
        while True:
            arriving = asyncio.ensure_future(anext(chunks, b""))
            if boundary.at_boundary:
                # Between events the stream may end here: whichever comes first.
                await asyncio.wait((arriving, ended), return_when=asyncio.FIRST_COMPLETED)
                if not arriving.done():
                    arriving.cancel()
                    await asyncio.wait((arriving,))
                    if not arriving.cancelled():
                        arriving.exception()  # the tool's stream broke meanwhile: moot
                    return False
            chunk = await arriving
            if not chunk:
                return True
            boundary.feed(chunk)
            await request.write_body(chunk)
    finally:
        ended.cancel()
        # Cancelled while waiting (the agent left): the read in flight goes too, or the
        # tool's broken stream it ends in is an error nobody retrieves.
        if arriving is not None and not arriving.done():
            arriving.cancel()
