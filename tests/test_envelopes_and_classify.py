"""Envelope dialects into one ToolFailure, and the decision matrix as a pure function."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.outcomes import AttemptError
from sidecar.retry.classify import Action, classify
from sidecar.tool.envelopes import Reply, decoded_text, inspect, parse_failure

RETRY_ON = frozenset({500, 502, 503, 504})


def failure_of(document, status=400):
    return parse_failure(document, success_status=200 <= status < 300)


def test_gomind_tool_response():
    failure = failure_of(
        {
            "success": False,
            "error": {
                "code": "LOCATION_NOT_FOUND",
                "message": "City 'Flower Mound, TX' not found",
                "category": "not_found",
                "retryable": True,
                "details": {"retry_after": "2s", "suggested_location": "Flower Mound, US"},
            },
        }
    )
    assert failure is not None
    assert (failure.dialect, failure.code, failure.category) == (
        "gomind",
        "LOCATION_NOT_FOUND",
        "NOT_FOUND",
    )
    assert failure.retryable is True
    assert failure.retry_after == "2s"
    assert failure.details["suggested_location"] == "Flower Mound, US"


def test_mira_bot_format():
    failure = failure_of(
        {
            "error": {
                "code": "INVALID_UNITS",
                "category": "INPUT_ERROR",
                "source": "weather-tool",
                "message": "units must be one of metric, imperial",
                "context": {"field": "units"},
                "recovery": {
                    "is_retryable": True,
                    "retry_strategy": {
                        "suggested_delay": 500,
                        "max_retries": 2,
                        "parameter_adjustments": {"units": "metric"},
                    },
                    "alternatives": [],
                    "required_actions": [],
                },
                "debug": {"trace": "..."},
            }
        }
    )
    assert failure is not None
    assert failure.dialect == "mira"
    assert failure.retryable is True
    assert failure.suggested_delay_ms == 500
    assert failure.parameter_adjustments == {"units": "metric"}
    assert failure.details == {"field": "units"}


def test_problem_details():
    failure = failure_of(
        {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "slow",
            "retryable": True,
            "retry_after": 3,
        },
        status=429,
    )
    assert failure is not None
    assert (failure.dialect, failure.code, failure.message) == (
        "problem",
        "Too Many Requests",
        "slow",
    )
    assert failure.retryable is True
    assert failure.retry_after == 3


def test_jsonrpc_error_and_mcp_tool_error():
    rpc = failure_of(
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "Invalid params"}},
        status=200,
    )
    assert rpc is not None
    assert (rpc.dialect, rpc.code, rpc.category) == ("jsonrpc", "-32602", "INPUT_ERROR")

    mcp = failure_of(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {
                "isError": True,
                "content": [{"type": "text", "text": "lat: expected number"}],
            },
        },
        status=200,
    )
    assert mcp is not None
    assert (mcp.dialect, mcp.message) == ("mcp", "lat: expected number")

    ok = {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}
    assert failure_of(ok, status=200) is None


def test_success_bodies_are_not_failures():
    assert failure_of({"success": True, "data": {}}, status=200) is None
    assert failure_of({"error": {"code": "X"}}, status=200) is None  # no success: false
    assert failure_of({"success": True, "error": {"code": "X"}}, status=500) is None
    assert failure_of({"detail": [{"msg": "field required"}]}, status=422) is None


@pytest.mark.parametrize(
    "document",
    [
        [1, 2, 3],
        "error",
        42,
        None,
        {"success": False, "error": "plain string"},
        {"error": {"code": {"nested": True}, "retryable": "yes", "category": 7}},
        {"error": {"code": "X", "category": "SOMETHING_UNKNOWN", "details": [1, 2]}},
    ],
)
def test_garbage_envelopes_yield_a_value_or_none(document):
    failure = failure_of(document)
    if failure is not None:
        assert failure.retryable in (None, True, False)
        assert isinstance(failure.details, dict)


def test_retryable_must_be_a_real_boolean():
    failure = failure_of({"error": {"code": "X", "retryable": "yes"}})
    assert failure is not None and failure.retryable is None


def test_huge_details_are_kept_out_of_messages():
    failure = failure_of({"error": {"code": "X", "message": "m" * 100_000}})
    assert failure is not None and len(failure.message) <= 2000


def test_compressed_bodies_are_inflated_for_inspection_only_and_bounded():
    body = b'{"success": false, "error": {"code": "X"}}'
    assert decoded_text(gzip.compress(body), "gzip") == body
    assert decoded_text(zlib.compress(body), "deflate") == body
    assert decoded_text(zlib.compress(body)[2:-4], "deflate") == body  # raw deflate
    assert decoded_text(b"\x1f\x8b garbage", "gzip") is None
    assert decoded_text(body, "br") is None
    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024))
    assert len(decoded_text(bomb, "gzip") or b"") <= 1024 * 1024


@given(st.binary(max_size=2048), st.integers(100, 599), st.sampled_from(["gzip", "deflate", None]))
def test_inspect_never_raises_on_any_bytes(body, status, encoding):
    failure, text = inspect(status, body, encoding)
    assert failure is None or failure.dialect
    assert isinstance(text, str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(
        st.sampled_from(["success", "error", "jsonrpc", "result", "title", "status", "detail"]),
        json_values,
    ),
    st.integers(100, 599),
)
def test_any_json_gives_a_verdict(document, status):
    failure = parse_failure(document, success_status=200 <= status < 300)
    verdict = classify(Reply(status, failure, json.dumps(document)), RETRY_ON)
    assert verdict.action in Action


@pytest.mark.parametrize(
    ("result", "action", "reason"),
    [
        (AttemptError.CONNECT, Action.RETRY, "connect_error"),
        (AttemptError.RESET, Action.RETRY, "reset"),
        (AttemptError.TIMEOUT, Action.RETRY, "timeout"),
        (Reply(503), Action.RETRY, "server_error"),
        (Reply(500), Action.RETRY, "server_error"),
        (Reply(429), Action.RETRY, "rate_limited"),
        (Reply(401), Action.DONE, "auth"),
        (Reply(403), Action.DONE, "auth"),
        (Reply(404), Action.DONE, "not_retryable"),
        (Reply(501), Action.DONE, "not_retryable"),
        (Reply(200), Action.DONE, "success"),
        (Reply(302), Action.DONE, "success"),
        (
            Reply(400, text="json: cannot unmarshal string into Go value of type float64"),
            Action.REPAIR,
            "validation",
        ),
        (Reply(400, text="type mismatch for field lat"), Action.REPAIR, "validation"),
        (Reply(400, text="limit must be greater than 0"), Action.REPAIR, "validation"),
        (Reply(400, text="city is required"), Action.REPAIR, "validation"),
        (
            Reply(422, text='{"detail":[{"loc":["body","lat"],"msg":"x","type":"float_parsing"}]}'),
            Action.REPAIR,
            "validation",
        ),
        (Reply(400, text="bad request"), Action.DONE, "not_retryable"),
    ],
)
def test_decision_matrix(result, action, reason):
    verdict = classify(result, RETRY_ON)
    assert (verdict.action, verdict.reason) == (action, reason)


def test_envelopes_refine_the_status():
    def verdict(status, **error):
        envelope = {"success": False, "error": {"code": "X", **error}}
        return classify(Reply(status, failure_of(envelope, status)), RETRY_ON)

    assert verdict(404, retryable=True).action is Action.REPAIR
    assert verdict(404, retryable=False).action is Action.DONE
    assert verdict(503, retryable=False).action is Action.DONE
    assert verdict(200, category="RATE_LIMIT").reason == "rate_limited"
    assert verdict(200, category="SERVICE_ERROR").reason == "server_error"
    assert verdict(200, category="INPUT_ERROR").action is Action.DONE
    assert verdict(200, category="INPUT_ERROR", message="lat is required").action is Action.REPAIR
    assert verdict(200, category="AUTH_ERROR", retryable=True).reason == "auth"
    assert verdict(200, category="WHO_KNOWS", retryable=True).reason == "server_error"
    assert verdict(200, category="WHO_KNOWS").action is Action.DONE


def test_only_failures_count_toward_the_circuit():
    assert classify(AttemptError.TIMEOUT, RETRY_ON).is_failure
    assert classify(Reply(503), RETRY_ON).is_failure
    assert not classify(Reply(429), RETRY_ON).is_failure
    assert not classify(Reply(404), RETRY_ON).is_failure
    assert not classify(Reply(200), RETRY_ON).is_failure


def test_values_too_large_for_json_encoders_still_make_messages():
    failure = failure_of({"error": {"code": 2**70, "message": [2**70]}})
    assert failure is not None and failure.code == str(2**70)
