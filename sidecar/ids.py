"""Identifiers made on every request, made cheaply."""

from __future__ import annotations

import os


def request_id() -> str:
    """A random 128-bit id as 32 hex digits, for ``X-Request-ID``."""
    return os.urandom(16).hex()


def idempotency_key() -> str:
    """A version-4 UUID string; ``str(uuid.uuid4())`` costs twice as much."""
    digits = os.urandom(16).hex()
    variant = "89ab"[int(digits[16], 16) & 3]
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"
