"""How long to wait before a retry, and whether a retry may happen at all. Pure functions.

Backoff follows AWS's "Exponential Backoff and Jitter": the exponential step is
``min(cap, base * multiplier ** n)``; ``full`` jitter waits uniformly in ``[0, step]``,
``equal`` in ``[step / 2, step]``, ``decorrelated`` in ``[base, previous * 3]`` (capped),
``none`` exactly ``step``.

A wait the tool asked for is stretched by a random factor in ``[1, 1.25]``: callers that
all got ``Retry-After: 1`` at once would otherwise all come back in the same millisecond.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.values import JitterMode
from sidecar.outcomes import Outcome, Wait

Uniform = Callable[[float, float], float]

# Requested waits are stretched by up to this factor (Envoy spreads them by up to 1.5).
REQUESTED_WAIT_SPREAD = 1.25


@dataclass(frozen=True, slots=True)
class Backoff:
    base_s: float
    cap_s: float
    multiplier: float
    jitter: JitterMode
    uniform: Uniform = random.uniform

    def delay(self, retry_number: int, previous_s: float | None = None) -> float:
        """The wait before retry ``retry_number`` (1 for the first retry)."""
        step = min(self.cap_s, self.base_s * self.multiplier ** min(retry_number - 1, 64))
        if self.jitter == "full":
            return self.uniform(0.0, step)
        if self.jitter == "equal":
            return step / 2 + self.uniform(0.0, step / 2)
        if self.jitter == "decorrelated":
            upper = max(self.base_s, (previous_s if previous_s is not None else self.base_s) * 3)
            return min(self.cap_s, self.uniform(self.base_s, upper))
        return step

    def spread(self, requested_s: float) -> float:
        """A requested wait, stretched so that concurrent callers do not return together."""
        return requested_s * self.uniform(1.0, REQUESTED_WAIT_SPREAD)


# The retries a request gets whatever its tool's state: 0.5's count. Past them, a retry is
# spent only while the tool shows it is up (``CircuitBreaker.answering``), so that a tool
# that is down gets no more retries than in 0.5, and a flaky one all the window allows.
RETRIES_WHILE_UNPROVEN = 3


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one request's retries."""

    max_retries: int  # the cap; the retry window and the budget bound them before it
    max_retry_after_s: float


def attempt_timeout_s(
    per_try_s: float, to_deadline_s: float, to_window_s: float, *, first: bool
) -> float:
    """How long one attempt may wait for its answer's head.

    The whole request's deadline bounds every attempt: past it nobody waits. The retry
    window bounds the retries, not the call: a first attempt is not cut by it, so a tool
    whose healthy answer takes longer than a window sized for an agent's retries still
    answers; a retry's attempt ends with the window.
    """
    if first:
        return min(per_try_s, to_deadline_s)
    return min(per_try_s, to_window_s, to_deadline_s)


def plan_wait(
    *,
    retries_done: int,
    limits: Limits,
    requested_s: float | None,
    backoff: Backoff,
    previous_s: float | None,
    time_left_s: float,
    unreachable: bool,
    tool_answering: bool = True,
) -> Wait | Outcome:
    """The wait before the next retry, or why there is none.

    Past ``RETRIES_WHILE_UNPROVEN`` retries only a tool that shows it is up
    (``tool_answering``) is tried again, up to ``max_retries``. A wait the tool asked for is
    honoured up to ``max_retry_after_s``; past that the answer goes back at once (sleeping
    that long helps nobody). It is spread within those limits and the retry window, and
    never shortened. No wait may outlast the window.
    """
    unproven = retries_done >= RETRIES_WHILE_UNPROVEN and not tool_answering
    if retries_done >= limits.max_retries or unproven:
        return Outcome.UNREACHABLE if unreachable else Outcome.EXHAUSTED
    if requested_s is not None:
        if requested_s > limits.max_retry_after_s:
            return Outcome.NOT_RETRYABLE
        stretched = min(backoff.spread(requested_s), limits.max_retry_after_s)
        wait = Wait(stretched if stretched < time_left_s else requested_s, "retry_after")
    else:
        wait = Wait(backoff.delay(retries_done + 1, previous_s), "backoff")
    if wait.seconds >= time_left_s:
        return Outcome.DEADLINE
    return wait


def plan_cooldown(
    *, cooldown_s: float, limits: Limits, backoff: Backoff, time_left_s: float
) -> Wait | Outcome:
    """The wait before an attempt while the fleet knows the tool is cooling down, or why
    the request cannot wait that long. Spread like a requested wait, for the same reason:
    every replica read the same expiry."""
    if cooldown_s > limits.max_retry_after_s:
        return Outcome.NOT_RETRYABLE
    if cooldown_s >= time_left_s:
        return Outcome.DEADLINE
    stretched = min(backoff.spread(cooldown_s), limits.max_retry_after_s)
    return Wait(stretched if stretched < time_left_s else cooldown_s, "cooldown")
