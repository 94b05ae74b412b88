"""The tool's answer, relayed to the agent as it came."""

from __future__ import annotations

from collections.abc import Mapping

import structlog
from aiohttp import web

from sidecar.serve.answers import ExactResponse, ExactStreamResponse
from sidecar.transport.exchange import Answer, BodyBroken
from sidecar.transport.headers import end_to_end_headers

_log = structlog.get_logger("sidecar")


async def relay(
    request: web.BaseRequest, answer: Answer, report: Mapping[str, str]
) -> web.StreamResponse:
    """The tool's status, reason, headers and body bytes as they came, plus ``report``.

    Hop-by-hop headers and any ``X-Sidecar-*`` header of the tool's (which could pass for
    the sidecar's own report) are dropped. A body read whole goes out with its length;
    the rest streams, keeping the tool's ``Content-Length`` when it sent one. If the tool
    breaks off mid-stream the agent's connection is closed too, so a cut body can never
    pass for a whole one.
    """
    headers = end_to_end_headers(answer.response.headers, drop_control=True)
    headers.update(report)
    if answer.complete:
        # Headers and body leave in one write; aiohttp states the body's length.
        answer.discard()
        headers.popall("Content-Length", None)
        return ExactResponse(
            status=answer.status, reason=answer.response.reason, headers=headers, body=answer.body
        )
    response = ExactStreamResponse(
        status=answer.status, reason=answer.response.reason, headers=headers
    )
    try:
        await response.prepare(request)
        if answer.body:
            await response.write(answer.body)
        async for chunk in answer.rest():
            await response.write(chunk)
        await response.write_eof()
    except ConnectionError:
        _log.debug("client_disconnected", status=answer.status)
    except BodyBroken as broken:
        _log.warning("upstream_stream_broken", status=answer.status, reason=str(broken))
        if request.transport is not None:
            request.transport.close()
    finally:
        answer.discard()
    return response
