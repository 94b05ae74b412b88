"""Ended spans batched, encoded to OTLP protobuf and sent over HTTP, off the event loop.

The SDK's path costs each span a ``ReadableSpan``, a lock and a wake-up in its batch
processor on the event loop, and 17–27 µs in its protobuf encoder (a message object per
attribute, the resource hashed through JSON per span). Here an ended span is appended to
a queue as the record it is; a worker thread encodes a batch straight to protobuf bytes,
each name's and attribute set's bytes made once and reused (1.6 µs a span), and POSTs it.

What it reads is what the SDK reads, from the same variables and with the same defaults:
``OTEL_BSP_*`` for the batches, and for the exporter the endpoint (the traces one as
given, else the general one plus ``/v1/traces``), headers, timeout (seconds),
compression (``gzip``, ``deflate``), CA certificate and client certificate and key.
A credential provider (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_*CREDENTIAL_PROVIDER``) is the
SDK's alone: with one set, ``otel.tracer_provider`` uses the SDK's exporter instead.
"""

from __future__ import annotations

import gzip
import os
import random
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import requests
import structlog
from opentelemetry.sdk import environment_variables as env
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind
from opentelemetry.util.re import parse_env_headers

from sidecar import __version__
from sidecar.telemetry.spans import SpanRecord

_log = structlog.get_logger("sidecar")

_STATUS_TRANSIENT = frozenset({429, 502, 503, 504})
_MAX_TRIES = 6
_ATTRIBUTE_CACHE_LIMIT = 4096
_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
_double = struct.Struct("<d").pack
# Span.flags: the parent's remoteness is known (the SDK's encoder sets this on every span).
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_ERROR_STATUS = b"\x7a\x02\x18\x02"  # Span.status (15) = Status{code (3): ERROR (2)}
# Span.kind (6): OTLP's kinds count from "unspecified", the SDK's from "internal".
_KINDS = {kind: b"\x30" + bytes((kind.value + 1,)) for kind in SpanKind}


_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _any_value(value: object) -> bytes:
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if isinstance(value, str):
        return _field(1, value.encode("utf-8"))
    if isinstance(value, Sequence):
        return _field(5, b"".join(_field(1, _any_value(item)) for item in value))
    return _field(1, str(value).encode("utf-8"))


# Span.start_time_unix_nano (7) and end_time_unix_nano (8), both fixed64, in one pack.
_times = struct.Struct("<BQBQ").pack
# Span.flags (16, fixed32): the parent's remoteness known, and whether it is remote.
_FLAGS = {
    False: b"\x85\x01" + _fixed32(_HAS_IS_REMOTE),
    True: b"\x85\x01" + _fixed32(_HAS_IS_REMOTE | _IS_REMOTE),
}


class Encoder:
    """Spans to an ``ExportTraceServiceRequest``. A request's spans repeat the same few
    names and attribute sets, so each name's and each attribute set's bytes are made once;
    a span costs its ids, its times and a few lookups."""

    def __init__(self, resource: Resource, scope_name: str, scope_version: str) -> None:
        self._attribute_sets: dict[tuple[int, tuple[tuple[str, Any], ...]], bytes] = {}
        self._names: dict[str, bytes] = {}
        self._resource = _field(1, self._attributes(1, resource.attributes))
        scope = _field(1, scope_name.encode()) + _field(2, scope_version.encode())
        self._scope = _field(1, scope)

    def encode(self, spans: Sequence[SpanRecord]) -> bytes:
        body = self._scope + b"".join(_field(2, self._span(span)) for span in spans)
        return _field(1, self._resource + _field(2, body))

    def _attributes(self, number: int, attributes: Mapping[str, Any]) -> bytes:
        """``attributes`` as repeated KeyValue field ``number``."""
        try:
            key = (number, tuple(attributes.items()))
            return self._attribute_sets[key]
        except KeyError:
            encoded = b"".join(
                _field(number, _field(1, name.encode("utf-8")) + _field(2, _any_value(value)))
                for name, value in attributes.items()
            )
            if len(self._attribute_sets) < _ATTRIBUTE_CACHE_LIMIT:
                self._attribute_sets[key] = encoded
            return encoded
        except TypeError:  # an unhashable value (a list): made each time
            return b"".join(
                _field(number, _field(1, name.encode("utf-8")) + _field(2, _any_value(value)))
                for name, value in attributes.items()
            )

    def _name(self, name: str) -> bytes:
        encoded = self._names.get(name)
        if encoded is None:
            encoded = _field(5, name.encode("utf-8"))
            if len(self._names) < _ATTRIBUTE_CACHE_LIMIT:
                self._names[name] = encoded
        return encoded

    def _span(self, span: SpanRecord) -> bytes:
        parts = [
            b"\x0a\x10" + span.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + span.span_id.to_bytes(8, "big"),
        ]
        if span.trace_state:
            parts.append(_field(3, span.trace_state.to_header().encode()))
        if span.parent_id is not None:
            parts.append(b"\x22\x08" + span.parent_id.to_bytes(8, "big"))
        parts += [
            self._name(span.name),
            _KINDS[span.kind],
            _times(0x39, span.start_ns, 0x41, span.end_ns or span.start_ns),
            self._attributes(9, span.attributes),
        ]
        for name, attributes, timestamp in span.events:
            event_message = b"\x09" + _fixed64(timestamp) + _field(2, name.encode("utf-8"))
            parts.append(_field(11, event_message + self._attributes(3, attributes)))
        if span.error:
            parts.append(_ERROR_STATUS)
        parts.append(_FLAGS[span.parent_remote])
        return b"".join(parts)


def _setting(specific: str, general: str, default: str = "") -> str:
    return os.environ.get(specific) or os.environ.get(general) or default


class Sender:
    """One POST per batch to the OTLP/HTTP endpoint the environment names, retried with
    backoff while the collector answers a transient status, within the timeout."""

    def __init__(self) -> None:
        self.endpoint = os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or (
            _setting(env.OTEL_EXPORTER_OTLP_ENDPOINT, "", "http://localhost:4318/").removesuffix(
                "/"
            )
            + "/v1/traces"
        )
        self._headers = {
            "content-type": "application/x-protobuf",
            "user-agent": f"tool-retry-sidecar/{__version__}",
            **parse_env_headers(
                _setting(env.OTEL_EXPORTER_OTLP_TRACES_HEADERS, env.OTEL_EXPORTER_OTLP_HEADERS),
                liberal=True,
            ),
        }
        timeout = _setting(env.OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, env.OTEL_EXPORTER_OTLP_TIMEOUT)
        self._timeout_s = _number(timeout, 10.0)
        self._compression = (
            _setting(
                env.OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
                env.OTEL_EXPORTER_OTLP_COMPRESSION,
                "none",
            )
            .strip()
            .lower()
        )
        if self._compression in ("gzip", "deflate"):
            self._headers["content-encoding"] = self._compression
        certificate = _setting(
            env.OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, env.OTEL_EXPORTER_OTLP_CERTIFICATE
        )
        self._verify: bool | str = certificate or True
        client_certificate = _setting(
            env.OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
            env.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
        )
        client_key = _setting(
            env.OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, env.OTEL_EXPORTER_OTLP_CLIENT_KEY
        )
        self._cert = (client_certificate, client_key) if client_certificate else None
        self._session = requests.Session()

    def send(self, body: bytes) -> bool:
        if self._compression == "gzip":
            body = gzip.compress(body)
        elif self._compression == "deflate":
            body = zlib.compress(body)
        deadline = time.monotonic() + self._timeout_s
        for attempt in range(_MAX_TRIES):
            status, error = self._post(body, deadline)
            if status is not None and 200 <= status < 300:
                return True
            retry_in = 2**attempt * random.uniform(0.8, 1.2)
            transient = status in _STATUS_TRANSIENT or status is None
            if not transient or time.monotonic() + retry_in >= deadline:
                _log.warning("trace_export_failed", status=status, error=error)
                return False
            time.sleep(retry_in)
        return False

    def _post(self, body: bytes, deadline: float) -> tuple[int | None, str | None]:
        try:
            answer = self._session.post(
                self.endpoint,
                data=body,
                headers=self._headers,
                timeout=max(0.01, deadline - time.monotonic()),
                verify=self._verify,
                cert=self._cert,
            )
        except requests.RequestException as exc:
            return None, type(exc).__name__
        return answer.status_code, None

    def close(self) -> None:
        self._session.close()


def _number(text: str, default: float) -> float:
    try:
        return float(text) if text else default
    except ValueError:
        return default


class SpanBatcher:
    """Ended spans queued as they are and exported in batches from a thread of its own, as
    the SDK's batch processor would: every ``OTEL_BSP_SCHEDULE_DELAY`` ms, or as soon as
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` wait; past ``OTEL_BSP_MAX_QUEUE_SIZE`` new ones are
    dropped (and counted in the log when the queue drains)."""

    def __init__(self, encoder: Encoder, sender: Sender) -> None:
        self._encoder = encoder
        self._sender = sender
        self._delay_s = _number(os.environ.get(env.OTEL_BSP_SCHEDULE_DELAY, ""), 5000) / 1000
        self._max_queue = int(_number(os.environ.get(env.OTEL_BSP_MAX_QUEUE_SIZE, ""), 2048))
        self._batch = int(_number(os.environ.get(env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE, ""), 512))
        self._queue: deque[SpanRecord] = deque()
        self._dropped = 0
        self._wake = threading.Event()
        self._exporting = threading.Lock()
        self._stopped = False
        self._worker = threading.Thread(target=self._run, name="sidecar-spans", daemon=True)
        self._worker.start()

    def add(self, span: SpanRecord) -> None:
        """Queue an ended span (on the event loop: no lock, no object but the record)."""
        queue = self._queue
        if len(queue) >= self._max_queue:
            self._dropped += 1
            return
        queue.append(span)
        if len(queue) == self._batch:
            self._wake.set()

    def flush(self) -> None:
        """Export every span queued so far, now, in the calling thread."""
        with self._exporting:
            self._export(len(self._queue))

    def close(self) -> None:
        """Stop the worker and export what is left."""
        self._stopped = True
        self._wake.set()
        self._worker.join()
        self.flush()
        self._sender.close()

    def _run(self) -> None:
        while not self._stopped:
            full = self._wake.wait(self._delay_s)
            self._wake.clear()
            with self._exporting:
                # Woken by a full batch: whole batches only, so that spans ending during an
                # export wait for the next batch instead of going out a few at a time.
                queued = len(self._queue)
                self._export(queued - queued % self._batch if full else queued)

    def _export(self, count: int) -> None:
        queue = self._queue
        while count > 0:
            batch = [queue.popleft() for _ in range(min(self._batch, count))]
            count -= len(batch)
            if self._dropped:
                _log.warning("trace_spans_dropped", spans=self._dropped, queue_size=self._max_queue)
                self._dropped = 0
            self._sender.send(self._encoder.encode(batch))
