"""How long a callback held the event loop: ``sidecar_event_loop_lag_seconds``, and one
``event_loop_stalled`` line for each stall past ``STALL_LOG_S``.

Everything the sidecar does for every agent runs on one loop, so a stall anywhere is a
stall for all of them; a timer that should fire every ``SAMPLE_INTERVAL_S`` and fires late
measures it (as Node's ``monitorEventLoopDelay`` and aiomonitor do), at the cost of ten
wake-ups a second.
"""

from __future__ import annotations

import asyncio

import structlog

from sidecar.telemetry.metric_series import GaugeSeries

SAMPLE_INTERVAL_S = 0.1
# A stall an agent with a 1 s budget notices: a quarter of it.
STALL_LOG_S = 0.25

_log = structlog.get_logger("sidecar")


async def watch_loop_lag(gauge: GaugeSeries) -> None:
    """Measure the loop's lag until cancelled."""
    sampler = _Sampler(asyncio.get_running_loop(), gauge)
    try:
        await asyncio.get_running_loop().create_future()  # done only by cancelling
    finally:
        sampler.stop()


class _Sampler:
    """One timer callback per sample, not a task sleeping: a task's wake-up adds a future,
    a second callback and a coroutine step to each of the ten samples a second."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gauge: GaugeSeries) -> None:
        self._loop = loop
        self._gauge = gauge
        self._due = loop.time() + SAMPLE_INTERVAL_S
        self._timer = loop.call_at(self._due, self._sample)

    def _sample(self) -> None:
        now = self._loop.time()
        lag_s = max(0.0, now - self._due)
        self._gauge.set((), lag_s)
        if lag_s > STALL_LOG_S:
            _log.warning("event_loop_stalled", lag_s=round(lag_s, 3))
        self._due = now + SAMPLE_INTERVAL_S
        self._timer = self._loop.call_at(self._due, self._sample)

    def stop(self) -> None:
        self._timer.cancel()
