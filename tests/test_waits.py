"""Upstream-requested waits: every spelling, and nothing absurd gets through."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.retry.waits import (
    duration_seconds,
    milliseconds,
    requested_wait,
    reset_seconds,
    retry_after_seconds,
)
from sidecar.tool.envelopes import ToolFailure

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("120", 120.0),
        (" 3 ", 3.0),
        (formatdate(NOW + 30, usegmt=True), 30.0),
        ("Mon, 01 Jan 1990 00:00:00 GMT", 0.0),
        ("Sun, 01 Jan 2090 00:00:00 GMT", datetime(2090, 1, 1, tzinfo=UTC).timestamp() - NOW),
        ("-5", None),
        ("abc", None),
        ("1e309", None),
        ("1.5", None),
        ("²", None),
        ("", None),
        (None, None),
        ("Mon, 01 Jan 1990 00:00:00", None),  # no zone: not an HTTP-date
    ],
)
def test_retry_after(value, expected):
    wait = retry_after_seconds(value, NOW)
    assert wait == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", 30.0),
        (str(int(NOW) + 45), 45.0),
        ("0", 0.0),
        ("-1", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
    ],
)
def test_rate_limit_reset(value, expected):
    assert reset_seconds(value, NOW) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("60s", 60.0),
        ("1500ms", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("2.5", 2.5),
        (7, 7.0),
        (0.25, 0.25),
        ("-3s", None),
        ("3 fortnights", None),
        (True, None),
        (float("inf"), None),
        (["1s"], None),
        (None, None),
    ],
)
def test_envelope_durations(value, expected):
    assert duration_seconds(value) == expected


def test_mira_suggested_delay_is_milliseconds():
    assert milliseconds(2500) == 2.5
    assert milliseconds("2500") is None
    assert milliseconds(-1) is None


def test_first_source_found_wins():
    failure = ToolFailure(dialect="mira", retry_after="9s", suggested_delay_ms=4000)
    assert requested_wait({"Retry-After": "1", "RateLimit-Reset": "2"}, failure, NOW) == 1.0
    assert requested_wait({"Retry-After": "x", "RateLimit-Reset": "2"}, failure, NOW) == 2.0
    assert requested_wait({"X-RateLimit-Reset": "3"}, failure, NOW) == 3.0
    assert requested_wait({}, failure, NOW) == 9.0
    assert requested_wait({}, ToolFailure(dialect="mira", suggested_delay_ms=4000), NOW) == 4.0
    assert requested_wait({}, None, NOW) is None


@given(st.text(max_size=60), st.text(max_size=30), st.one_of(st.none(), st.text(), st.floats()))
def test_any_input_gives_a_finite_non_negative_wait_or_none(header, reset, detail):
    failure = ToolFailure(dialect="gomind", retry_after=detail)
    wait = requested_wait({"Retry-After": header, "RateLimit-Reset": reset}, failure, NOW)
    assert wait is None or (math.isfinite(wait) and wait >= 0)
