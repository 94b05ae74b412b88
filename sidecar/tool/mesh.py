"""Whether a 5xx is the tool's own, or a proxy's beside the tool that lost the call — and
whether the call had reached the tool when it was lost.

Behind a tool-side Envoy (Istio) or Linkerd, a reset after the tool ran the call does not
reach the sidecar as a reset: the proxy answers for the tool with a local ``503`` (Envoy:
``upstream connect error or disconnect/reset before headers. reset reason: connection
termination``; Linkerd: a synthetic answer with an ``l5d-proxy-error`` header). Such an
answer means "delivered, no answer", like a reset on the sidecar's own connection, unless
its text says the call never left the proxy. Unknown text from a proxy counts as maybe
delivered: the one error that costs nothing to avoid is running a call twice.

The texts are Envoy's (``Utility::resetReasonToString``, the router's and the fault
filter's local replies) and Linkerd 2's proxy's (``SyntheticHttpResponse``: load shedding
answers ``503 service unavailable``, fail-fast ``504 … service in fail-fast``, both before
the call is dispatched).
"""

from __future__ import annotations

from collections.abc import Mapping

_RESET_PREFIX = "upstream connect error or disconnect/reset before headers. reset reason: "
# Envoy's reset reasons for a call that never reached the upstream: no connection was made
# ("connection failure" is the name before 1.22), the circuit breaker's pending queue
# overflowed, or an HTTP/2 upstream refused the stream (RFC 9113 §8.7: not processed).
_RESETS_BEFORE_DELIVERY = frozenset(
    {
        "local connection failure",
        "remote connection failure",
        "connection failure",
        "connection timeout",
        "overflow",
        "remote refused stream reset",
    }
)
# Envoy's local replies made before the router sends anything upstream.
_ENVOY_BEFORE_DELIVERY = frozenset({"no healthy upstream", "fault filter abort"})
# Linkerd's proxy errors raised before the request is dispatched (the end of the header's
# value: the innermost error, after its context).
_LINKERD_BEFORE_DELIVERY = ("service unavailable", "service in fail-fast")


def lost_after_delivery(
    status: int, headers: Mapping[str, str], text: str, *, tool_envelope: bool
) -> bool:
    """Whether a 5xx is a mesh proxy's own answer for a call it lost after the call may have
    reached the tool.

    ``headers`` are the answer's (case-insensitive), ``text`` the start of its body, and
    ``tool_envelope`` whether the body holds a tool's error envelope (the tool speaking,
    whatever proxy relayed it).
    """
    if status < 500 or tool_envelope:
        return False
    linkerd = headers.get("l5d-proxy-error")
    if linkerd is not None:
        return not linkerd.strip().endswith(_LINKERD_BEFORE_DELIVERY)
    if not _from_envoy(headers) or "x-envoy-upstream-service-time" in headers:
        return False  # no proxy of ours, or Envoy relaying the upstream's own answer
    if headers.get("x-envoy-overloaded", "").strip().lower() == "true":
        return False  # its circuit breaker or overload manager refused to send the call
    body = text.strip()
    if body in _ENVOY_BEFORE_DELIVERY:
        return False
    if body.startswith(_RESET_PREFIX):
        reason = body.removeprefix(_RESET_PREFIX).partition(",")[0]
        return reason not in _RESETS_BEFORE_DELIVERY
    # "… retried and the latest reset reason: …" tells only of the last of Envoy's own
    # attempts; an earlier one may have reached the tool.
    return True


def _from_envoy(headers: Mapping[str, str]) -> bool:
    """Whether Envoy answered: its ``server`` name (``envoy``, Istio's ``istio-envoy``) or a
    header of its own."""
    if "envoy" in headers.get("server", "").lower():
        return True
    return any(name.lower().startswith("x-envoy-") for name in headers)
