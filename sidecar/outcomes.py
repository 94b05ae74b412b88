"""How an attempt and a request end: the words every layer shares.

An attempt ends in an answer or in ``NoAnswer``: one ``AttemptError`` kind, never both,
and for a malformed answer its fault in words. The kinds say where the attempt stopped,
because that decides whether it may be sent again::

    AttemptError
    ├── not delivered: nothing reached the tool, so a replay is always safe
    │   ├── CONNECT          refused, DNS, a connect that failed
    │   └── CONNECT_TIMEOUT  a connect that hung past the per-try timeout
    ├── delivered, no answer head: the tool may be working on it (see ``replay``)
    │   ├── TIMEOUT          the per-try timeout (or the deadline) passed first
    │   └── RESET            the connection broke first
    ├── delivered and answered, in bytes no one can pass on: never retried
    │   └── MALFORMED        not one unambiguous HTTP/1.1 answer (``transport.answer``)
    └── the sidecar's own saturation: never the tool's fault, never retried
        ├── POOL_TIMEOUT     no free connection in the sidecar's pool in time
        └── NO_FDS           the process is out of file descriptors

A request ends in one ``Outcome``, the ``X-Sidecar-Outcome`` the agent reads; between
attempts it may ``Wait``.
"""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass
from typing import NamedTuple


class AttemptError(enum.Enum):
    """The value is the attempt's token in ``X-Sidecar-Trail``."""

    CONNECT = "connect_error"
    CONNECT_TIMEOUT = "connect_timeout"
    TIMEOUT = "timeout"
    RESET = "reset"
    POOL_TIMEOUT = "pool_timeout"
    NO_FDS = "fd_exhausted"
    MALFORMED = "malformed"

    @property
    def delivered(self) -> bool:
        """The request may have reached the tool (and may be running there)."""
        return self in (AttemptError.TIMEOUT, AttemptError.RESET)

    @property
    def not_connected(self) -> bool:
        """Nothing reached the tool: no connection was made."""
        return self in (AttemptError.CONNECT, AttemptError.CONNECT_TIMEOUT)

    @property
    def local(self) -> bool:
        """The sidecar itself is saturated; the tool was never asked."""
        return self in (AttemptError.POOL_TIMEOUT, AttemptError.NO_FDS)


class NoAnswer(NamedTuple):
    """An attempt that ended without an answer the agent can have."""

    error: AttemptError
    reason: str | None = None  # a malformed answer's fault, in words


def out_of_descriptors(exc: object) -> bool:
    """Whether ``exc`` (an exception, or anything) says no file descriptor is left."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


class Outcome(enum.StrEnum):
    """How a request ended: the ``X-Sidecar-Outcome``. All but the first two say why no
    further attempt was made."""

    OK = "ok"
    RECOVERED = "recovered"
    EXHAUSTED = "exhausted"
    UNREACHABLE = "unreachable"
    NOT_RETRYABLE = "not-retryable"
    BUDGET = "budget-exhausted"
    DEADLINE = "deadline"
    OVERLOADED = "overloaded"  # the sidecar itself had no room for the call


# The sidecar stopped although the tool's answer was not a success: the agent's own
# client should not add retries on top (``x-should-retry: false``).
GAVE_UP = frozenset(
    {
        Outcome.EXHAUSTED,
        Outcome.UNREACHABLE,
        Outcome.NOT_RETRYABLE,
        Outcome.BUDGET,
        Outcome.DEADLINE,
    }
)


# The label of an attempt cancelled because the copy racing it answered first (hedging).
CANCELLED_ATTEMPT = "cancelled"


@dataclass(frozen=True, slots=True)
class Wait:
    """A wait before the next attempt, and what asked for it."""

    seconds: float
    source: str  # "backoff" or "retry_after"
