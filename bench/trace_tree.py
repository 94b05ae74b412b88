"""The span tree of one real run, as text: what an agent's trace shows of a recovered call.

    python bench/trace_tree.py

Starts, on 127.0.0.1, a Go-style tool that answers 503 once and then 400 while ``lat``
is a string, an OpenAI-compatible model that corrects ``lat``, an OTLP/HTTP collector,
and the sidecar as a process with ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` pointing at the
collector. One call goes through with an agent's ``traceparent``; the sidecar is stopped
(SIGTERM flushes its spans) and the spans received are printed as a tree, events in
time order among the children. Everything started is stopped before the script returns.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from processes import SIDECAR_ON_LOOPBACK, free_port, wait_for_port  # noqa: E402

from tests.otlp import ReceivedSpan, Receiver, receiver_app  # noqa: E402

SHOWN = (
    "sidecar.attempt",
    "http.response.status_code",
    "error.type",
    "sidecar.retry.reason",
    "sidecar.repair.layer",
    "sidecar.repair.fields",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "sidecar.outcome",
    "sidecar.attempts",
    "sidecar.trail",
)
_KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT"}


def tool_app() -> web.Application:
    calls = 0

    async def forecast(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        payload = await request.json()
        if calls == 1:
            return web.Response(status=503, text="busy")
        if not isinstance(payload.get("lat"), int | float):
            return web.Response(
                status=400,
                text="json: cannot unmarshal string into Go struct field "
                "Request.lat of type float64",
            )
        return web.json_response({"success": True, "data": {"temp_c": 21.5}})

    app = web.Application()
    app.router.add_post("/forecast", forecast)
    return app


def model_app() -> web.Application:
    async def chat(_: web.Request) -> web.Response:
        fix = {
            "can_fix": True,
            "analysis": "lat must be a number",
            "corrected_payload": {"lat": 35.6, "lon": 139.7},
            "is_transient": False,
        }
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "repair-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": json.dumps(fix)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 412, "completion_tokens": 38, "total_tokens": 450},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def render(spans: list[ReceivedSpan]) -> list[str]:
    ids = {span.span_id for span in spans}
    roots = [span for span in spans if span.parent_id not in ids]
    origin = min(span.start_ns for span in spans)
    lines: list[str] = []

    def ms(ns: int) -> str:
        return f"{(ns - origin) / 1e6:7.1f} ms"

    def walk(span: ReceivedSpan, prefix: str, last: bool, top: bool) -> None:
        shown = " ".join(
            f"{name.removeprefix('sidecar.')}={_text(span.attributes[name])}"
            for name in SHOWN
            if name in span.attributes
        )
        branch = "" if top else ("└─ " if last else "├─ ")
        duration = (span.end_ns - span.start_ns) / 1e6
        lines.append(
            f"{ms(span.start_ns)}  {prefix}{branch}{span.name} [{_KINDS.get(span.kind, '?')}] "
            f"{duration:.1f} ms  {shown}".rstrip()
        )
        inner = prefix if top else prefix + ("   " if last else "│  ")
        children = sorted(
            [(child.start_ns, 1, child) for child in spans if child.parent_id == span.span_id]
            + [(at, 0, event) for event in span.events for at in (event[1],)],
            key=lambda entry: (entry[0], entry[1]),
        )
        for index, (at, is_span, item) in enumerate(children):
            is_last = index == len(children) - 1
            if is_span:
                walk(item, inner, is_last, False)
            else:
                name, _, attributes = item
                fields = " ".join(
                    f"{key.removeprefix('sidecar.')}={_text(value)}"
                    for key, value in attributes.items()
                )
                lines.append(f"{ms(at)}  {inner}{'└─ ' if is_last else '├─ '}• {name} {fields}")

    for root in roots:
        walk(root, "", True, True)
    return lines


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, str) and " " in value:
        return json.dumps(value)
    return str(value)


async def main() -> int:
    receiver = Receiver()
    ports = {name: free_port() for name in ("collector", "tool", "model", "sidecar", "admin")}
    runners = [
        await serve(receiver_app(receiver), ports["collector"]),
        await serve(tool_app(), ports["tool"]),
        await serve(model_app(), ports["model"]),
    ]
    environment = {
        **{name: value for name, value in os.environ.items() if not name.startswith("OTEL_")},
        **SIDECAR_ON_LOOPBACK,
        "SIDECAR_LLM_BASE_URL": f"http://127.0.0.1:{ports['model']}/v1",
        "SIDECAR_LLM_MODEL": "repair-model",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": (f"http://127.0.0.1:{ports['collector']}/v1/traces"),
    }
    sidecar = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "serve",
        "--upstream",
        f"http://127.0.0.1:{ports['tool']}",
        "--port",
        str(ports["sidecar"]),
        "--admin-port",
        str(ports["admin"]),
        env=environment,
        stdout=subprocess.DEVNULL,
    )
    agent_trace, agent_span = secrets.token_hex(16), secrets.token_hex(8)
    try:
        await asyncio.to_thread(wait_for_port, ports["sidecar"])
        async with ClientSession() as client:
            response = await client.post(
                f"http://127.0.0.1:{ports['sidecar']}/forecast",
                json={"lat": "35.6", "lon": 139.7},
                headers={"traceparent": f"00-{agent_trace}-{agent_span}-01"},
            )
            print(f"agent got {response.status}, trail: {response.headers['X-Sidecar-Trail']}")
    finally:
        sidecar.terminate()  # SIGTERM: the sidecar drains and flushes its spans
        await asyncio.wait_for(sidecar.wait(), 30)
        for runner in runners:
            await runner.cleanup()
    print(f"agent's span {agent_span} in trace {agent_trace}; the sidecar's spans:")
    servers = [span for span in receiver.spans if span.kind == 2]
    assert [(span.trace_id, span.parent_id) for span in servers] == [(agent_trace, agent_span)]
    print("\n".join(render(receiver.spans)))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
