"""Identifiers made on every request, made cheaply.

They need to be unique, not secret: neither a request id nor an idempotency key guards
anything. So they come from a per-process Mersenne Twister (seeded from the OS at start)
rather than ``os.urandom``, whose system call showed up in the hot path's profile.
"""

from __future__ import annotations

import random

_random = random.Random()


def request_id() -> str:
    """A random 128-bit id as 32 hex digits, for ``X-Request-ID``."""
    return f"{_random.getrandbits(128):032x}"


def idempotency_key() -> str:
    """A version-4 UUID string."""
    digits = f"{_random.getrandbits(128):032x}"
    variant = "89ab"[int(digits[16], 16) & 3]
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"
