"""The model's answer bounded like a tool's: in bytes read and inflated, in tokens, and a
refused answer form held back for a while, not for the process's life."""

from __future__ import annotations

import asyncio
import functools
import json
import tracemalloc
import zlib

import brotli
import pytest
import zstandard
from aiohttp import web
from structlog.testing import capture_logs

from sidecar.repair.llm_format import REFUSAL_HOLD_S, answer_tokens
from tests.conftest import FakeClock, completion
from tests.test_llm_structured import LLAMA_CPP_PYTHON_REFUSAL, form_of
from tests.test_repair import CORRECT_CITY, fix, location_tool

MiB = 1024 * 1024
GiB = 1024 * MiB


@functools.cache
def gzip_bomb() -> bytes:
    """1 GiB of zeros as one gzip member, about 1 MiB sent: 1 MiB deflated once and
    repeated, each copy flushed whole so it stands alone, as a compressor would write it."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = compressor.compress(bytes(MiB)) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(1024):
        crc = zlib.crc32(bytes(MiB), crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = crc.to_bytes(4, "little") + (GiB % 2**32).to_bytes(4, "little")
    return header + block * 1024 + b"\x03\x00" + trailer


@functools.cache
def brotli_bomb() -> bytes:
    """4 GiB of zeros in brotli, under 1 MiB sent: inflation, not the read, must stop it."""
    compressor = brotli.Compressor(quality=1)
    chunk = bytes(64 * MiB)
    pieces = [compressor.process(chunk) for _ in range(64)]
    return b"".join(pieces) + compressor.finish()


@functools.cache
def zstd_bomb() -> bytes:
    """1 GiB of zeros in zstd, a few KB sent."""
    compressor = zstandard.ZstdCompressor(level=3)
    writer = compressor.compressobj(size=GiB)
    chunk = bytes(64 * MiB)
    return b"".join(writer.compress(chunk) for _ in range(16)) + writer.flush()


BOMBS = {"gzip": gzip_bomb, "br": brotli_bomb, "zstd": zstd_bomb}


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
async def test_a_compressed_bomb_from_the_model_gives_the_repair_up_in_bounded_memory(
    make_tool, make_sidecar, make_llm, encoding, status
):
    bomb = BOMBS[encoding]()
    assert len(bomb) < 2 * MiB

    async def bombing() -> web.Response:
        headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
        return web.Response(body=bomb, status=status, headers=headers)

    tool = await make_tool(location_tool())
    llm = await make_llm(bombing)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, llm_max_repairs=1)
    direct = await (
        await sidecar.client.session.post(tool.url, json={"location": "Flower Mound, TX"})
    ).read()

    tracemalloc.start()
    try:
        with capture_logs() as logs:
            response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})
            body = await response.read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert response.status == 404
    assert body == direct, "the tool's own answer"
    assert response.headers["X-Sidecar-Trail"] == "404 repair=none"
    # 1 MiB of answer at most, held in a few copies while it is read, inflated and parsed.
    assert peak < 24 * MiB, f"peak {peak / MiB:.0f} MiB"
    labels = {"route": "default", "layer": "llm", "result": "answer_too_large"}
    assert sidecar.metric("sidecar_repairs_total", **labels) == 1
    assert sidecar.metric("sidecar_llm_requests_total", result="error") == 1
    failed = [entry for entry in logs if entry["event"] == "llm_request_failed"]
    assert [entry["error"] for entry in failed] == ["AnswerTooLarge"]


async def test_an_answer_just_under_the_bound_is_read(make_tool, make_sidecar, make_llm):
    padding = " " * (200 * 1024)  # JSON whitespace: the answer is the same, only longer
    answer = json.dumps(fix({"location": CORRECT_CITY})) + padding

    async def padded() -> web.Response:
        inner = completion(answer)
        assert isinstance(inner.body, bytes)
        return web.Response(
            body=zlib.compress(inner.body),
            headers={"Content-Encoding": "deflate", "Content-Type": "application/json"},
        )

    tool = await make_tool(location_tool())
    llm = await make_llm(padded)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 200
    assert response.headers["X-Sidecar-Repaired"] == "llm"


async def test_every_call_carries_max_tokens_sized_for_the_answer(
    make_tool, make_sidecar, make_llm
):
    tool = await make_tool(location_tool())
    llm = await make_llm(fix({"location": CORRECT_CITY}))
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, llm_max_answer_tokens=300)

    await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})
    await sidecar.client.post("/w", json={"location": "F" * 4000})

    small, large = (request["max_tokens"] for request in llm.requests)
    assert small == answer_tokens(len('{"location":"Flower Mound, TX"}'), 300) < 300
    assert large == 300, "the setting caps it"


@pytest.mark.parametrize(
    ("payload_bytes", "most", "tokens"),
    [(0, 4096, 256), (30, 4096, 296), (3000, 4096, 4096), (3, 100, 100)],
)
def test_max_tokens_leaves_room_for_the_largest_payload_the_guard_takes(
    payload_bytes, most, tokens
):
    assert answer_tokens(payload_bytes, most) == tokens


async def test_an_answer_cut_at_max_tokens_gives_the_repair_up(make_tool, make_sidecar, make_llm):
    async def runs_on() -> web.Response:
        cut = completion('{"analysis": "the city is written out as Flower Mound, Texas, United')
        document = json.loads(cut.body)  # type: ignore[arg-type]
        document["choices"][0]["finish_reason"] = "length"
        return web.json_response(document)

    tool = await make_tool(location_tool())
    llm = await make_llm(runs_on)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url)

    with capture_logs() as logs:
        response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 404
    assert len(llm.requests) == 1, "a cut answer is not asked again"
    labels = {"route": "default", "layer": "llm", "result": "answer_cut"}
    assert sidecar.metric("sidecar_repairs_total", **labels) == 1
    assert [entry["reason"] for entry in logs if entry["event"] == "repair_refused"] == [
        "answer_cut"
    ]


async def test_a_refused_answer_form_is_asked_for_again_after_a_while(
    make_tool, make_sidecar, make_llm
):
    refusing = True

    async def llama_cpp_python() -> web.Response:
        if refusing and form_of(llm.requests[-1]) == "json_schema":
            return web.json_response(LLAMA_CPP_PYTHON_REFUSAL, status=500)
        return completion(json.dumps(fix({"location": CORRECT_CITY})))

    clock = FakeClock()
    tool = await make_tool(location_tool())
    llm = await make_llm(llama_cpp_python)
    sidecar = await make_sidecar(tool, llm_base_url=llm.base_url, clock=clock)

    async def call(location: str) -> None:
        response = await sidecar.client.post("/w", json={"location": location})
        assert response.status == 200

    await call("Flower Mound, TX")
    clock.now += REFUSAL_HOLD_S - 1
    await call("Flower Mound")  # another failure: the answer cache does not answer it
    refusing = False  # the endpoint was fixed
    clock.now += 2
    await call("Flower Mound, Tex")

    assert [form_of(request) for request in llm.requests] == [
        "json_schema",
        "json_object_schema",
        "json_object_schema",
        "json_schema",
    ]


async def test_an_answer_that_trickles_in_is_cut_at_the_llm_timeout(
    make_tool, make_sidecar, aiohttp_server
):
    written = 0

    async def trickling(request: web.Request) -> web.StreamResponse:
        nonlocal written
        # Each byte well inside the client's read timeout, the whole far past the call's.
        answer = web.StreamResponse(headers={"Content-Type": "application/json"})
        await answer.prepare(request)
        for _ in range(200):
            await answer.write(b" ")
            written += 1
            await asyncio.sleep(0.05)
        return answer

    app = web.Application()
    app.router.add_post("/v1/chat/completions", trickling)
    llm = await aiohttp_server(app)
    tool = await make_tool(location_tool())
    sidecar = await make_sidecar(
        tool, llm_base_url=str(llm.make_url("/v1")), llm_timeout_ms=300, llm_max_repairs=1
    )

    response = await sidecar.client.post("/w", json={"location": "Flower Mound, TX"})

    assert response.status == 404, "the tool's answer"
    assert sidecar.metric("sidecar_llm_requests_total", result="timeout") == 1
    assert written < 200, "the call was cut before the answer ended"
