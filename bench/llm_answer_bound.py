"""What one model call costs in memory when the endpoint answers with a compression bomb:
the ``openai`` client as 0.4 built it, beside the same client over the sidecar's bounded
transport (``sidecar/repair/llm_http.py``, ``SIDECAR_LLM_MAX_ANSWER_BYTES`` = 1 MiB).

    python bench/llm_answer_bound.py [--inflated-mib 256]

An aiohttp endpoint on 127.0.0.1 answers every chat completion with zeros, gzip- or
brotli-compressed, on a 200 and on a 500. Each case runs in a child process of its own and
reports its peak resident memory (``ru_maxrss``) over the same process's before the call,
and the call's seconds; the child is stopped by its PID after ``--timeout`` seconds. The
bombs are kept at a few hundred MiB inflated (not 0.4's 4 GiB) so the unbounded client
cannot take a shared machine down. Not part of the suite: tests/test_llm_bounds.py holds the
bound at 1 GiB and 4 GiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, json, resource, sys, time, zlib
import brotli, openai
from aiohttp import web
from sidecar.repair.llm_http import bounded_http_client

client_kind, encoding = sys.argv[1], sys.argv[2]
status, inflated_mib = int(sys.argv[3]), int(sys.argv[4])
MiB = 1024 * 1024
if encoding == "gzip":
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    pieces = [compressor.compress(bytes(MiB)) for _ in range(inflated_mib)]
    body = b"".join(pieces) + compressor.flush()
else:
    compressor = brotli.Compressor(quality=1)
    pieces = [compressor.process(bytes(MiB)) for _ in range(inflated_mib)]
    body = b"".join(pieces) + compressor.finish()

async def main():
    async def bomb(request):
        headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
        return web.Response(body=body, status=status, headers=headers)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", bomb)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    options = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key": "none"}
    options.update(max_retries=0, timeout=60)
    if client_kind == "bounded":
        options["http_client"] = bounded_http_client(openai, MiB)
    client = openai.AsyncOpenAI(**options)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    try:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        outcome = "answered"
    except Exception as exc:
        cause = exc.__cause__
        outcome = type(exc).__name__ + (f" ({type(cause).__name__})" if cause else "")
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    await client.close()
    await runner.cleanup()
    peak_mib = (peak - before) / 1024
    row = {"sent": len(body), "outcome": outcome, "seconds": seconds, "peak_mib": peak_mib}
    print(json.dumps(row))

asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inflated-mib", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    print(f"bombs of {args.inflated_mib} MiB inflated")
    print(f"{'client':9} {'bomb':5} {'status':>6} {'sent':>9} {'+peak MiB':>10} {'s':>6}  outcome")
    for client in ("openai", "bounded"):
        for encoding in ("gzip", "br"):
            for status in (200, 500):
                command = [sys.executable, "-c", CHILD, client, encoding, str(status)]
                child = subprocess.Popen(
                    [*command, str(args.inflated_mib)], stdout=subprocess.PIPE, text=True, cwd=ROOT
                )
                try:
                    out, _ = child.communicate(timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    child.kill()  # by the PID this script started
                    child.wait()
                    print(f"{client:9} {encoding:5} {status:>6} > {args.timeout:.0f} s")
                    continue
                row = json.loads(out)
                print(
                    f"{client:9} {encoding:5} {status:>6} {row['sent']:>9} "
                    f"{row['peak_mib']:>10.1f} {row['seconds']:>6.2f}  {row['outcome']}"
                )


if __name__ == "__main__":
    main()
