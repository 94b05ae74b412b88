"""br and zstd answers are inflated for inspection like gzip: bounded, never raising."""

from __future__ import annotations

from functools import partial

import brotli
import orjson
import pytest
import zstandard
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from sidecar.tool.envelopes import MAX_INFLATED_BYTES, decoded_text, inspect
from tests.conftest import scripted

ENVELOPE = orjson.dumps(
    {
        "success": False,
        "error": {"code": "BACKEND_DOWN", "message": "try later", "category": "SERVICE_ERROR"},
    }
)
COMPRESS = {
    "br": partial(brotli.compress, quality=5),  # the default, 11, takes seconds on a bomb
    "zstd": zstandard.ZstdCompressor().compress,
}


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_br_and_zstd_inflate_like_gzip(encoding):
    assert decoded_text(COMPRESS[encoding](ENVELOPE), encoding) == ENVELOPE
    assert decoded_text(COMPRESS[encoding](ENVELOPE), encoding.upper()) == ENVELOPE
    assert decoded_text(b"\x28\xb5\x2f\xfd garbage, not " + encoding.encode(), encoding) is None
    assert decoded_text(b"", encoding) in (b"", None)


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_a_bomb_inflates_no_further_than_the_cap(encoding):
    bomb = COMPRESS[encoding](b"\0" * (16 * MAX_INFLATED_BYTES))
    assert len(bomb) < 16 * 1024
    inflated = decoded_text(bomb, encoding)
    assert inflated is not None and len(inflated) == MAX_INFLATED_BYTES


def test_a_zstd_frame_asking_for_a_window_past_8_mib_is_refused():
    compressor = zstandard.ZstdCompressor(
        compression_params=zstandard.ZstdCompressionParameters(window_log=24)
    )
    stream = compressor.compressobj()
    frame = stream.compress(b"\0" * (17 * 1024 * 1024)) + stream.flush()
    assert decoded_text(frame, "zstd") is None


@given(st.binary(max_size=512), st.sampled_from(["br", "zstd"]))
def test_any_bytes_labelled_br_or_zstd_never_raise(body, encoding):
    failure, text = inspect(503, body, encoding)
    assert failure is None or failure.dialect
    assert isinstance(text, str)


def compressed(encoding: str, body: bytes, *, raw: bool = False):
    return partial(
        web.Response,
        status=200,
        body=body if raw else COMPRESS[encoding](body),
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    )


@pytest.mark.parametrize("encoding", ["br", "zstd"])
async def test_a_compressed_200_service_error_is_retried(make_tool, make_sidecar, encoding):
    success = COMPRESS[encoding](b'{"success": true, "data": 1}')
    tool = await make_tool(
        scripted(compressed(encoding, ENVELOPE), compressed(encoding, success, raw=True))
    )
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/report", headers={"Accept-Encoding": encoding})

    assert len(tool.seen) == 2
    assert response.headers["X-Sidecar-Outcome"] == "recovered"
    assert response.headers["X-Sidecar-Trail"].startswith("200 backoff=")
    assert response.headers["Content-Encoding"] == encoding
    assert await response.read() == success  # still compressed: relayed as the tool sent it
    assert len(sidecar.sleep.waits) == 1


@pytest.mark.parametrize("encoding", ["br", "zstd"])
async def test_garbage_labelled_br_or_zstd_is_relayed_unchanged(make_tool, make_sidecar, encoding):
    garbage = b"\x28\xb5\x2f\xfd\x00\xffnot really compressed" + bytes(range(256))
    tool = await make_tool(scripted(compressed(encoding, garbage, raw=True)))
    sidecar = await make_sidecar(tool)

    response = await sidecar.client.get("/report")

    assert len(tool.seen) == 1
    assert response.status == 200
    assert response.headers["X-Sidecar-Outcome"] == "ok"
    assert response.headers["Content-Encoding"] == encoding
    assert await response.read() == garbage
