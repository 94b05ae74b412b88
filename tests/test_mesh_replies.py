"""A mesh proxy's own 5xx beside the tool: delivered and lost, or never sent.

The table holds the proxies' exact local replies (Envoy 1.40, checked against the binary
``bench/envoy.py`` fetches; Linkerd 2's ``l5d-proxy-error`` values); the end-to-end tests
use an aiohttp tool that answers with Envoy's exact bytes.
"""

from __future__ import annotations

from collections import Counter

import pytest
from aiohttp import web
from multidict import CIMultiDict

from sidecar.retry.classify import Action, Verdict, classify
from sidecar.tool.envelopes import Reply
from sidecar.tool.mesh import lost_after_delivery

RETRY_ON = frozenset({500, 502, 503, 504})
RESET = "upstream connect error or disconnect/reset before headers. reset reason: "
# Envoy 1.40's local reply headers, as it sent them (x-envoy-attempt-count when the route
# asks for it).
ENVOY = {"content-type": "text/plain", "server": "envoy", "x-envoy-attempt-count": "1"}
ISTIO = {"content-type": "text/plain", "server": "istio-envoy"}
UPSTREAM_VIA_ENVOY = {"server": "envoy", "x-envoy-upstream-service-time": "3"}

LOST, NOT_SENT, TOOL = True, False, False


@pytest.mark.parametrize(
    ("status", "headers", "body", "lost"),
    [
        # Envoy: a reset after the call went out
        (503, ENVOY, RESET + "connection termination", LOST),
        (503, ISTIO, RESET + "connection termination", LOST),
        (503, ENVOY, RESET + "remote reset", LOST),
        (503, ENVOY, RESET + "local reset", LOST),
        (503, ENVOY, RESET + "overload manager reset", LOST),
        (502, ENVOY, RESET + "protocol error", LOST),
        (504, ENVOY, "upstream request timeout", LOST),
        (503, ENVOY, RESET + "some reason a later Envoy names", LOST),
        (503, {"server": "envoy"}, "", LOST),  # an empty or unread body: unknown
        (503, {"x-envoy-decorator-operation": "tool"}, "service unavailable", LOST),
        # ... Envoy's own retries: only the last attempt is told of
        (
            503,
            ENVOY,
            RESET.replace("reset reason", "retried and the latest reset reason")
            + "remote connection failure",
            LOST,
        ),
        # Envoy: the call never left it
        (503, ENVOY, RESET + "remote connection failure", NOT_SENT),
        (503, ENVOY, RESET + "local connection failure", NOT_SENT),
        (503, ENVOY, RESET + "connection failure", NOT_SENT),  # before 1.22
        (503, ENVOY, RESET + "connection timeout", NOT_SENT),
        (503, ENVOY, RESET + "remote refused stream reset", NOT_SENT),
        (503, ENVOY, RESET + "overflow", NOT_SENT),
        (
            503,
            ENVOY,
            RESET + "remote connection failure, transport failure reason: delayed connect "
            "error: Connection refused",
            NOT_SENT,
        ),
        (503, ENVOY, "no healthy upstream", NOT_SENT),
        (503, ENVOY, "fault filter abort", NOT_SENT),
        (503, {**ENVOY, "x-envoy-overloaded": "true"}, "", NOT_SENT),
        # Linkerd: its synthetic answers, the error in a header
        (500, {"l5d-proxy-error": "unexpected error"}, "", LOST),
        (502, {"l5d-proxy-error": "connection closed before message completed"}, "", LOST),
        (504, {"l5d-proxy-error": "response timeout"}, "", LOST),
        (503, {"l5d-proxy-error": "logical service web:8080: service unavailable"}, "", NOT_SENT),
        (504, {"l5d-proxy-error": "web:8080: service in fail-fast"}, "", NOT_SENT),
        # the tool's own answers
        (503, UPSTREAM_VIA_ENVOY, RESET + "connection termination", TOOL),  # relayed by Envoy
        (503, {"server": "nginx"}, RESET + "connection termination", TOOL),  # no mesh at all
        (503, {}, "upstream connect error", TOOL),
        (429, ENVOY, "local_rate_limited", TOOL),  # not a 5xx: never a lost call
        (404, {"l5d-proxy-error": "no route"}, "", TOOL),
    ],
)
def test_a_mesh_proxy_s_5xx(status, headers, body, lost):
    assert lost_after_delivery(status, CIMultiDict(headers), body, tool_envelope=False) is lost


def test_a_tool_s_envelope_is_the_tool_speaking_whatever_proxy_relayed_it():
    """A JSON error envelope in a 503 through a sidecar Envoy that suppresses its headers."""
    headers = CIMultiDict({"server": "envoy"})
    assert not lost_after_delivery(503, headers, '{"error": {}}', tool_envelope=True)


@pytest.mark.parametrize(
    ("lost", "verdict"),
    [
        (True, Verdict(Action.RETRY, "server_error", is_failure=True, only_if_safe=True)),
        (False, Verdict(Action.RETRY, "server_error", is_failure=True)),
    ],
)
def test_a_call_lost_after_delivery_is_sent_again_only_when_safe(lost, verdict):
    assert classify(Reply(503, None, RESET + "x", lost), RETRY_ON) == verdict


def test_a_lost_call_outside_retry_on_status_is_returned():
    assert classify(Reply(503, None, "", True), frozenset({502})).action is Action.DONE


# --- end to end: a tool behind "Envoy" (its exact local replies) --------------------------


def envoy_reply(reason: str) -> web.Response:
    """Envoy 1.40's local reply, byte for byte as the binary sent it (but for the date)."""
    return web.Response(
        status=503,
        text=RESET + reason,
        content_type="text/plain",
        headers={"server": "envoy", "x-envoy-attempt-count": "1"},
        charset=None,
    )


def behind_envoy(ran: Counter[str], reason: str):
    """Each path's first call ends in Envoy's local reply for ``reason`` — after the tool ran
    it for a reset, before it for a connect failure; later calls in the tool's answer.
    ``ran`` counts the calls the tool ran."""
    calls: Counter[str] = Counter()

    async def handle(request: web.Request) -> web.Response:
        calls[request.path] += 1
        if calls[request.path] == 1:
            if reason != "remote connection failure":
                ran[request.path] += 1
            return envoy_reply(reason)
        ran[request.path] += 1
        return web.json_response({"success": True, "data": {"order": request.path}})

    return handle


async def test_envoy_s_503_after_a_reset_is_not_replayed_for_a_post(make_tool, make_sidecar):
    runs: Counter[str] = Counter()
    tool = await make_tool(behind_envoy(runs, "connection termination"))
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post("/orders/1", json={"item": "tea"})

    assert answer.status == 503
    assert await answer.text() == RESET + "connection termination"
    assert answer.headers["X-Sidecar-Trail"] == "503 stop=not_replayable"
    assert answer.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert runs["/orders/1"] == 1


async def test_envoy_s_503_after_a_reset_is_replayed_for_a_call_safe_to_repeat(
    make_tool, make_sidecar
):
    runs: Counter[str] = Counter()
    tool = await make_tool(behind_envoy(runs, "connection termination"))
    sidecar = await make_sidecar(tool)

    keyed = await sidecar.client.post("/orders/2", json={}, headers={"Idempotency-Key": "k-2"})
    read = await sidecar.client.get("/orders/3")

    assert [keyed.status, read.status] == [200, 200]
    assert keyed.headers["X-Sidecar-Outcome"] == read.headers["X-Sidecar-Outcome"] == "recovered"
    assert runs == {"/orders/2": 2, "/orders/3": 2}


async def test_envoy_s_503_for_a_connect_failure_is_replayed_for_a_post(make_tool, make_sidecar):
    """Nothing reached the tool: sent again like the sidecar's own connect error."""
    runs: Counter[str] = Counter()
    tool = await make_tool(behind_envoy(runs, "remote connection failure"))
    sidecar = await make_sidecar(tool)

    answer = await sidecar.client.post("/orders/4", json={"item": "tea"})

    assert answer.status == 200
    assert answer.headers["X-Sidecar-Outcome"] == "recovered"
    assert runs["/orders/4"] == 1
