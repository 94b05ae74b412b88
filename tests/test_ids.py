"""Request ids and idempotency keys: well-formed and unique."""

from __future__ import annotations

import uuid

from sidecar.ids import idempotency_key, request_id


def test_idempotency_keys_are_distinct_version_4_uuids():
    keys = [idempotency_key() for _ in range(10_000)]
    assert len(set(keys)) == len(keys)
    for key in keys[:500]:
        parsed = uuid.UUID(key)
        assert (str(parsed), parsed.version, parsed.variant) == (key, 4, uuid.RFC_4122)


def test_request_ids_are_distinct_hex():
    ids = [request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(value) == 32 and int(value, 16) >= 0 for value in ids)
