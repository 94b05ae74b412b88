"""Cooldowns the fleet knows of: waited out before an attempt, and learned from answers.

A cooldown is a time the tool is not to be called: a wait it asked for, or an open
circuit's. Only a fleet store holds them across requests; without one, a request waits
for what its own answers asked and nothing is kept.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from sidecar.outcomes import Outcome
from sidecar.retry.attempt import Attempt, seconds_token
from sidecar.retry.guards.fleet import RouteState
from sidecar.retry.policy import Backoff, Limits, plan_cooldown
from sidecar.retry.waits import requested_wait
from sidecar.transport.exchange import Answer


async def wait_out(
    fleet: RouteState,
    path: str,
    *,
    limits: Limits,
    backoff: Backoff,
    time_left_s: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
    trail: list[str],
) -> tuple[float, Outcome] | None:
    """Wait until the fleet's cooldown of the tool ends; when the request cannot wait that
    long, the cooldown left and why not."""
    # Looked up again after each wait: while this request slept, the tool may have
    # started a new cooldown that another replica has published.
    while (cooldown_s := await fleet.cooldown_s(path)) > 0:
        plan = plan_cooldown(
            cooldown_s=cooldown_s, limits=limits, backoff=backoff, time_left_s=time_left_s()
        )
        if isinstance(plan, Outcome):
            trail.append(f"cooldown={seconds_token(cooldown_s)} stop={plan.value}")
            return cooldown_s, plan
        trail.append(f"{plan.source}={seconds_token(plan.seconds)}")
        await sleep(plan.seconds)
    return None


async def learn_requested_wait(attempt: Attempt, fleet: RouteState | None, path: str) -> None:
    """Read the wait a failed attempt's answer asks for; tell the fleet when it shares.

    A header's wait (``Retry-After``, ``RateLimit-Reset``) is the tool's word on the whole
    tool (the whole route, in the ``route`` circuit scope); a wait in the envelope answers
    this call, so it holds for its path.
    """
    if not isinstance(attempt.result, Answer) or attempt.reply is None:
        return
    headers, failure, now = attempt.result.response.headers, attempt.reply.failure, time.time()
    attempt.requested_s = requested_wait(headers, None, now)
    if attempt.requested_s is None and failure is not None:
        attempt.requested_s = requested_wait({}, failure, now)
        attempt.path_scoped = True
    if fleet is not None and attempt.requested_s is not None:
        await fleet.publish_cooldown(attempt.requested_s, path if attempt.path_scoped else None)
