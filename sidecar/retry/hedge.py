"""Hedged attempts: one more copy of a slow call that is safe to repeat; the first answer
head wins, and the other copy is cancelled, which closes its connection.

Envoy (``hedge_on_per_try_timeout``), gRPC and Polly send a second copy after a delay
without knowing whether running the call twice is harmless; the retry machine asks for a
hedge only when it is (``replay.safe_to_repeat``) and the retry budget pays for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sidecar.outcomes import CANCELLED_ATTEMPT, NoAnswer
from sidecar.retry.steps import Send, SendHedged
from sidecar.telemetry import Hooks
from sidecar.transport.exchange import UpstreamRequest, send
from sidecar.transport.pool import Pool, Response

Result = TypeVar("Result")


@dataclass(frozen=True, slots=True)
class Raced(Generic[Result]):
    """What came back first, and whether a second copy went out at all."""

    sent: Result
    hedged: bool


async def race(
    send: Callable[[bool], Awaitable[Result]],
    *,
    after_s: float,
    may_hedge: Callable[[], bool],
    answered: Callable[[Result], bool],
    dropped: Callable[[Result], None],
) -> Raced[Result]:
    """``send(False)``, and ``send(True)`` too when the first has not ended after
    ``after_s`` and ``may_hedge()`` agrees (it is asked once, and pays for the copy).

    The first copy to end ``answered`` wins. A copy that ended without an answer waits
    for the other; when neither answers, the one that ended last is returned. Every
    ended copy not returned goes to ``dropped``; a copy still running is cancelled.
    """
    first = asyncio.ensure_future(send(False))
    running: list[asyncio.Future[Result]] = [first]
    try:
        done, _ = await asyncio.wait(running, timeout=after_s)
        if done or not may_hedge():
            return Raced(await first, hedged=False)
        running.append(asyncio.ensure_future(send(True)))
        return Raced(await _first_answered(running, answered, dropped), hedged=True)
    finally:
        cancelled = [copy for copy in running if copy.cancel()]
        if cancelled:
            # Each cancelled copy reports its end and closes its connection first.
            await asyncio.wait(cancelled)


async def _first_answered(
    running: list[asyncio.Future[Result]],
    answered: Callable[[Result], bool],
    dropped: Callable[[Result], None],
) -> Result:
    """The first of ``running`` to end answered, else the last to end; ``running`` keeps
    the copies not yet ended."""
    unanswered: Result | None = None
    while running:
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        # Copies that ended together are taken in the order they were sent.
        for copy in [copy for copy in running if copy in done]:
            running.remove(copy)
            sent = copy.result()
            if unanswered is not None:
                dropped(unanswered)
            unanswered = sent
            if answered(sent):
                for other in [other for other in running if other.done()]:
                    running.remove(other)
                    dropped(other.result())
                return sent
    assert unanswered is not None
    return unanswered


Sent = Response | NoAnswer
Copied = tuple[Send, Sent]


class Hedging:
    """The I/O of hedged attempts: the race of the copies, and how each one ends. Whether a
    copy may go (the budget pays for it) is the retry machine's ``hedge_due``."""

    def __init__(self, pool: Pool, hooks: Hooks, clock: Callable[[], float]) -> None:
        self._pool = pool
        self._hooks = hooks
        self._clock = clock

    async def send(
        self,
        route: str,
        request_of: Callable[[Send], UpstreamRequest],
        hedged: SendHedged,
        hedge_due: Callable[[], Send | None],
    ) -> Copied:
        """The attempt's first answer head, or, when none came, what ended last;
        ``request_of`` is the request a copy sends (its trace context on)."""
        copies = [hedged.first]

        def may_hedge() -> bool:
            copy = hedge_due()
            if copy is not None:
                copies.append(copy)
            return copy is not None

        async def copy_of(hedge: bool) -> Copied:
            copy = copies[-1] if hedge else hedged.first
            try:
                return copy, await send(self._pool, request_of(copy), copy.per_try_s)
            except asyncio.CancelledError:
                self._finished(route, copy, CANCELLED_ATTEMPT)
                raise

        raced = await race(
            copy_of,
            after_s=hedged.after_s,
            may_hedge=may_hedge,
            answered=_answered,
            dropped=lambda copied: self._dropped(route, copied),
        )
        if raced.hedged:
            won = "won" if raced.sent[0].hedge else "lost"
            self._hooks.hedge_finished(route, won if _answered(raced.sent) else "unanswered")
        return raced.sent

    def _dropped(self, route: str, copied: Copied) -> None:
        copy, sent = copied
        if isinstance(sent, Response):
            sent.close()
            self._finished(route, copy, str(sent.status))
        else:
            self._finished(route, copy, sent.error.value)

    def _finished(self, route: str, copy: Send, label: str) -> None:
        self._hooks.attempt_finished(route, copy.number, label, self._clock() - copy.started, None)


def _answered(copied: Copied) -> bool:
    return isinstance(copied[1], Response)
