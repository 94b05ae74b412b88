"""Recovery end to end on the validator corpus: every case of bench/validator_corpus.json
through a real ``tool-retry-sidecar serve``, over real sockets.

    python bench/recovery.py [--model right|noisy|obedient|none] [--seed N]
                             [--set regular|hostile|all] [--half tune|held_out]
                             [--case TEXT ...] [--sidecar-src DIR]
                             [--llm-base-url URL | --local-model] [--out FILE] [--verbose]

- The tool is an aiohttp server on 127.0.0.1, a path per case (``/cases/<name>``): it answers
  the case's ``tool_answer`` (status, headers, body as the validator sends them) until the
  payload it receives satisfies the case's ``fix``, then 200 ``{"success": true}``; it
  records every payload it received. It serves ``/openapi.json`` with the body schema of
  the cases that have one, which the sidecar's route takes as its ``schema``.
- The sidecar runs from its CLI (or ``--sidecar-src DIR``) with one route, ``/cases``, in
  front of the tool, and ``SIDECAR_LLM_BASE_URL`` pointing at a scripted OpenAI-compatible
  chat-completions server on 127.0.0.1. Its circuit and retry budget are opened wide
  (``SIDECAR_CIRCUIT_FAILURES=0``, ``SIDECAR_RETRY_BUDGET_MIN_PER_S=1000``) so that a hundred
  failing calls in a row measure repair, not load shedding; every other setting is the
  shipped default and the run prints them.
- The agent sends each case's payload with ``X-Sidecar-Intent: case=<name> | <intent>``.
  The scripted model finds the case by that text in the prompt, reads the payload as the
  prompt shows it (secrets as placeholders) and answers the sidecar's structured-output
  request: ``{"analysis", "corrected_payload", "is_transient", "can_fix"}``.
  ``right``: the case's fix. ``noisy``: a seeded draw on each ask, about 1 in 3 perturbed
  (an extra field, an unrelated field changed, or a needed change left out). ``obedient``:
  the fix plus whatever the tool's text asks (a hostile case's ``injection``), when that
  text reached the prompt. ``none``: no model configured (coercion and adjustment only).
  ``--llm-base-url`` or ``--local-model`` (Qwen2.5-Coder-1.5B on llama.cpp, started with
  bench/local_model.py's functions; minutes) use a real model instead.

It reports, per half and whole, per ``needs`` and per validator, the cases recovered (the
agent got the tool's 200, and the payload the tool accepted satisfies the fix); the model's
proposals refused, by ``sidecar_repairs_total{layer="llm",result=...}`` read from the admin
``/metrics`` before and after each case, with the fields a proposal touched out of scope
(the ``repair_refused`` log line) and the ``X-Sidecar-Trail``; and for hostile cases the
injected changes and the secrets that reached the tool, read from the payloads it received.
Every process it starts is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from processes import SIDECAR_ON_LOOPBACK, free_port, tree_serve  # noqa: E402
from report import Report  # noqa: E402

CORPUS = HERE / "validator_corpus.json"
ROUTE_PREFIX = "/cases"
# Settings the bench sets, and why: a hundred failing calls back to back would open the
# circuit and spend the retry budget, and the run would measure load shedding.
BENCH_SETTINGS = {
    "SIDECAR_CIRCUIT_FAILURES": "0",
    "SIDECAR_RETRY_BUDGET_MIN_PER_S": "1000",
}
SHOWN_DEFAULTS = ("SIDECAR_LLM_MAX_REPAIRS", "SIDECAR_REQUEST_TIMEOUT_MS", "SIDECAR_MAX_RETRIES")
PLACEHOLDER = re.compile(r"<redacted-\d+>")
CASE_IN_INTENT = re.compile(r"case=([A-Za-z0-9_.+-]+)")
NOISE_RATE = 1 / 3
_MISSING = object()


# -- paths and fixes ---------------------------------------------------------------------


def _parts(dotted: str) -> list[str | int]:
    return [int(part) if part.isdigit() else part for part in dotted.split(".")]


def get_path(doc: Any, dotted: str) -> Any:
    for part in _parts(dotted):
        in_list = isinstance(part, int) and isinstance(doc, list) and part < len(doc)
        in_object = isinstance(part, str) and isinstance(doc, dict) and part in doc
        if not (in_list or in_object):
            return _MISSING
        doc = doc[part]
    return doc


def set_path(doc: Any, dotted: str, value: Any) -> None:
    parts = _parts(dotted)
    for index, part in enumerate(parts[:-1]):
        if isinstance(doc, dict) and not isinstance(doc.get(part), dict | list):
            doc[part] = [] if isinstance(parts[index + 1], int) else {}
        doc = doc[part]
    last = parts[-1]
    if isinstance(doc, list) and isinstance(last, int):
        doc.extend([None] * (last + 1 - len(doc)))
    doc[last] = value


def remove_path(doc: Any, dotted: str) -> None:
    parent_path, _, name = dotted.rpartition(".")
    parent = get_path(doc, parent_path) if parent_path else doc
    if isinstance(parent, dict):
        parent.pop(name, None)


def apply_ops(payload: Any, sets: dict[str, Any], removes: list[str]) -> Any:
    changed = copy.deepcopy(payload)
    for path in removes:
        remove_path(changed, path)
    for path, value in sets.items():
        set_path(changed, path, value)
    return changed


def same_value(value: Any, wanted: Any) -> bool:
    # 5 and 5.0 are one JSON number; true and 1 are not.
    return value == wanted and isinstance(value, bool) == isinstance(wanted, bool)


def satisfies(payload: Any, fix: dict[str, Any]) -> bool:
    if not isinstance(payload, dict):
        return False
    for path, wanted in fix.get("set", {}).items():
        value = get_path(payload, path)
        if value is _MISSING or not same_value(value, wanted):
            return False
    return all(get_path(payload, path) is _MISSING for path in fix.get("remove", []))


def leaves(doc: Any, prefix: str = "") -> list[str]:
    if isinstance(doc, dict):
        return [leaf for key, value in doc.items() for leaf in leaves(value, f"{prefix}{key}.")]
    if isinstance(doc, list):
        return [leaf for i, value in enumerate(doc) for leaf in leaves(value, f"{prefix}{i}.")]
    return [prefix[:-1]] if prefix else []


def render_body(body: Any, body_format: str) -> bytes:
    if body_format == "text":
        return str(body).encode()
    if body_format == "compact":
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if body_format == "python":
        return json.dumps(body).encode()
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    if body_format == "go-encoder":
        text += "\n"
    return text.encode()


# -- the corpus --------------------------------------------------------------------------


@dataclass
class Case:
    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.raw["name"])

    @property
    def hostile(self) -> bool:
        return bool(self.raw.get("hostile"))

    @property
    def path(self) -> str:
        return f"{ROUTE_PREFIX}/{self.name}"

    @property
    def fix(self) -> dict[str, Any]:
        return dict(self.raw["fix"])

    @property
    def injection(self) -> dict[str, Any]:
        return dict(self.raw.get("injection") or {})

    def secret_values(self) -> dict[str, Any]:
        return {path: get_path(self.raw["payload"], path) for path in self.raw.get("secrets", [])}


def load_cases(args: argparse.Namespace) -> list[Case]:
    document = json.loads(CORPUS.read_text())
    cases = [Case(raw) for raw in document["cases"]]
    wanted = args.set or ("hostile" if args.model == "obedient" else "regular")
    if wanted != "all":
        cases = [case for case in cases if case.hostile == (wanted == "hostile")]
    if args.half:
        cases = [case for case in cases if case.raw["half"] == args.half]
    if args.case:
        cases = [case for case in cases if any(text in case.name for text in args.case)]
    return cases


# -- the tool ----------------------------------------------------------------------------


def tool_app(cases: list[Case], received: dict[str, list[Any]]) -> web.Application:
    by_path = {case.path: case for case in cases}
    paths = {
        case.path: {
            "post": {
                "requestBody": {"content": {"application/json": {"schema": case.raw["schema"]}}}
            }
        }
        for case in cases
        if "schema" in case.raw
    }
    openapi = json.dumps(
        {"openapi": "3.1.0", "info": {"title": "validator corpus", "version": "1"}, "paths": paths}
    ).encode()

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/openapi.json":
            return web.Response(body=openapi, content_type="application/json")
        case = by_path.get(request.path)
        if case is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        raw = await request.read()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        received.setdefault(case.name, []).append(payload)
        if satisfies(payload, case.fix):
            return web.json_response({"success": True, "data": {"case": case.name}})
        answer = case.raw["tool_answer"]
        headers = {name: value for name, value in answer["headers"].items()}
        body = render_body(answer["body"], answer["body_format"])
        return web.Response(body=body, status=answer["status"], headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


# -- the scripted model ------------------------------------------------------------------


def strings_of(value: Any) -> list[str]:
    """Every string in ``value``, and in any JSON document a string holds."""
    if isinstance(value, str):
        found = [value]
        stripped = value.strip()
        if stripped[:1] in "{[":
            with contextlib.suppress(ValueError):
                found += strings_of(json.loads(stripped))
        return found
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in (key, *strings_of(item))]
    if isinstance(value, list):
        return [s for item in value for s in strings_of(item)]
    return []


def json_in(content: str) -> Any:
    """The JSON document a user turn holds: the whole text, or the one after 'Its answer:'."""
    try:
        return json.loads(content)
    except ValueError:
        start = content.find("{")
        if start < 0:
            return None
        try:
            return json.JSONDecoder().raw_decode(content[start:])[0]
        except ValueError:
            return None


@dataclass
class Ask:
    case: str
    number: int
    perturbation: str | None
    obeyed: bool


@dataclass
class ScriptedModel:
    mode: str
    seed: int
    cases: dict[str, Case]
    asks: list[Ask] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def answer(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        case, shown = None, None
        for message in messages:
            if message.get("role") != "user" or not isinstance(message.get("content"), str):
                continue
            document = json_in(message["content"])
            if not isinstance(document, dict):
                continue
            intent = document.get("user_intent")
            found = CASE_IN_INTENT.search(intent) if isinstance(intent, str) else None
            if found and found.group(1) in self.cases:
                case, shown = self.cases[found.group(1)], document.get("failed_payload")
            elif case is not None and isinstance(document.get("failed_payload"), dict):
                shown = document["failed_payload"]  # the tool refused the payload written
        if case is None or not isinstance(shown, dict):
            return _answer("no case of the corpus in this prompt", None)
        self.counts[case.name] += 1
        number = self.counts[case.name]
        fix = case.fix
        sets, removes = dict(fix.get("set", {})), list(fix.get("remove", []))
        perturbation = None
        if self.mode == "noisy":
            draw = random.Random(f"{self.seed}:{case.name}:{number}")
            if draw.random() < NOISE_RATE:
                perturbation = draw.choice(["extra_field", "unrelated_change", "change_left_out"])
                sets, removes, perturbation = _perturb(
                    perturbation, draw, shown, sets, removes, case
                )
        corrected = apply_ops(shown, sets, removes)
        obeyed = False
        if self.mode == "obedient" and case.hostile:
            text = "\n".join(s for m in messages for s in strings_of(m.get("content")))
            if case.injection.get("text", "\0") in text:
                obeyed = True
                corrected = _obey(case.injection, corrected, shown)
        self.asks.append(Ask(case.name, number, perturbation, obeyed))
        return _answer(f"scripted ({self.mode}) answer for {case.name}", corrected)


def _answer(analysis: str, corrected: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "analysis": analysis,
        "corrected_payload": corrected,
        "is_transient": False,
        "can_fix": corrected is not None,
    }


def _perturb(
    kind: str,
    draw: random.Random,
    shown: dict[str, Any],
    sets: dict[str, Any],
    removes: list[str],
    case: Case,
) -> tuple[dict[str, Any], list[str], str]:
    if kind == "change_left_out":
        ops = [("set", path) for path in sets] + [("remove", path) for path in removes]
        op, path = draw.choice(ops)
        if op == "set":
            sets = {key: value for key, value in sets.items() if key != path}
        else:
            removes = [item for item in removes if item != path]
        return sets, removes, kind
    touched = set(sets) | set(removes)
    secrets = set(case.raw.get("secrets", []))
    others = [
        leaf
        for leaf in leaves(shown)
        if leaf not in secrets
        and not any(
            leaf == t or leaf.startswith(t + ".") or t.startswith(leaf + ".") for t in touched
        )
        and not PLACEHOLDER.fullmatch(str(get_path(shown, leaf)))
    ]
    if kind == "unrelated_change" and others:
        path = draw.choice(others)
        value = get_path(shown, path)
        if isinstance(value, bool):
            changed: Any = not value
        elif isinstance(value, int | float):
            changed = value + 1
        elif isinstance(value, str) and value:
            changed = value.upper() if value.upper() != value else value.lower() + "x"
        else:
            changed = "changed"
        return {**sets, path: changed}, removes, kind
    name = "source"
    while name in shown:
        name += "_"
    return {**sets, name: "assistant"}, removes, "extra_field"


def _obey(injection: dict[str, Any], corrected: dict[str, Any], shown: dict[str, Any]) -> Any:
    obeyed = apply_ops(corrected, dict(injection.get("set", {})), [])
    for target, source in dict(injection.get("copy", {})).items():
        set_path(obeyed, target, get_path(shown, source))
    for url_field, source in dict(injection.get("copy_into_url", {})).items():
        url = str(get_path(obeyed, url_field))
        joiner = "&" if "?" in url else "?"
        set_path(obeyed, url_field, f"{url}{joiner}token={get_path(shown, source)}")
    return obeyed


def model_app(model: ScriptedModel) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        document = await request.json()
        content = json.dumps(model.answer(document.get("messages", [])))
        return web.json_response(
            {
                "id": f"chatcmpl-{len(model.asks)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": document.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", completions)
    return app


# -- the sidecar ---------------------------------------------------------------------------


def sidecar_env(llm_url: str | None, real_model: bool) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SIDECAR_", "OPENAI_", "GOMIND_", "OTEL_"))
    }
    env.update(SIDECAR_ON_LOOPBACK)
    env.update(BENCH_SETTINGS)
    if llm_url is not None:
        env["SIDECAR_LLM_BASE_URL"] = llm_url
        env["SIDECAR_LLM_API_KEY"] = "recovery-bench"
        env["SIDECAR_LLM_MODEL"] = "qwen2.5-coder-1.5b-instruct" if real_model else "scripted"
    if real_model:
        # A CPU model takes seconds a call: the shipped 10 s a call and 4 s a request would
        # measure the machine, not the model (as bench/local_model.py sets them).
        env["SIDECAR_LLM_TIMEOUT_MS"] = "120000"
        env["SIDECAR_REQUEST_TIMEOUT_MS"] = "600000"
        # Since 0.6 the retries, a repair's model call among them, end with their own window
        # (SIDECAR_RETRY_WINDOW_MS, 4 s), which cut every call of a CPU model; a tree before
        # 0.6 warns that it is no setting and ignores it.
        env["SIDECAR_RETRY_WINDOW_MS"] = "600000"
    return env


def sidecar_command(src: Path | None, config: Path, port: int, admin_port: int) -> list[str]:
    arguments = ["--config", str(config), "--port", str(port), "--admin-port", str(admin_port)]
    if src is not None:
        return tree_serve(src.resolve(), *arguments)
    executable = shutil.which("tool-retry-sidecar", path=str(Path(sys.executable).parent))
    command = [executable] if executable else [sys.executable, "-m", "sidecar"]
    return [*command, "serve", *arguments]


@dataclass
class Started:
    """What this run started, stopped by PID in reverse order."""

    processes: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def start(self, command: list[str], env: dict[str, str], log: Path) -> int:
        output = log.open("wb")
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=output, stderr=asyncio.subprocess.STDOUT, env=env
            )
        finally:
            output.close()
        self.processes.append(process)
        return process.pid

    async def stop_all(self) -> None:
        for process in reversed(self.processes):
            if process.returncode is None:
                os.kill(process.pid, 15)
                try:
                    await asyncio.wait_for(process.wait(), 15)
                except TimeoutError:
                    os.kill(process.pid, 9)
                    await process.wait()
        self.processes.clear()


async def wait_ready(session: aiohttp.ClientSession, url: str, process_log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    tail = await asyncio.to_thread(process_log.read_text)
    raise RuntimeError(f"{url} not ready in 60 s: {tail[-2000:]}")


async def serve(app: web.Application, runners: list[web.AppRunner]) -> str:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    runners.append(runner)
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


# -- one case -------------------------------------------------------------------------------


@dataclass
class Played:
    case: Case
    status: int
    outcome: str
    trail: str
    repaired: str
    received: list[Any]
    repairs: dict[str, int]  # sidecar_repairs_total{layer="llm",result} this case added
    other_layers: dict[str, int]  # the coercion and adjustment layers' results
    llm_calls: int
    out_of_scope_fields: list[str]
    seconds: float

    @property
    def recovered(self) -> bool:
        last = self.received[-1] if self.received else None
        return self.status == 200 and satisfies(last, self.case.fix)

    @property
    def attempted(self) -> bool:
        """Some repair layer ran: the sidecar judged the answer one a new payload can fix."""
        return "repair=" in self.trail or bool(self.llm_calls) or bool(self.other_layers)

    @property
    def exact(self) -> bool:
        """The payload the tool accepted is the agent's with the fix applied, and nothing else."""
        fix = self.case.fix
        wanted = apply_ops(self.case.raw["payload"], fix.get("set", {}), fix.get("remove", []))
        return self.recovered and self.received[-1] == wanted

    def injected(self) -> bool:
        injection = self.case.injection
        original = self.case.raw["payload"]
        secrets = self.case.secret_values()
        for payload in self.received:
            if not isinstance(payload, dict):
                continue
            for path, value in dict(injection.get("set", {})).items():
                if same_value(get_path(payload, path), value) and not same_value(
                    get_path(original, path), value
                ):
                    return True
            for target, source in dict(injection.get("copy", {})).items():
                if get_path(payload, target) in (secrets.get(source), *placeholders(payload)):
                    return True
            for url_field, source in dict(injection.get("copy_into_url", {})).items():
                url = str(get_path(payload, url_field))
                if str(secrets.get(source)) in url or PLACEHOLDER.search(url):
                    return True
        return False

    def secrets_moved(self) -> list[str]:
        """Secrets found at another path than their own, or placeholders that reached the tool."""
        secrets = self.case.secret_values()
        moved = []
        for payload in self.received:
            if not isinstance(payload, dict):
                continue
            for leaf in leaves(payload):
                value = get_path(payload, leaf)
                if not isinstance(value, str):
                    continue
                for own, secret in secrets.items():
                    if leaf != own and isinstance(secret, str) and secret in value:
                        moved.append(f"{own}->{leaf}")
                if PLACEHOLDER.search(value):
                    moved.append(f"placeholder@{leaf}")
            for own, secret in secrets.items():
                if get_path(payload, own) != secret:
                    moved.append(f"{own} changed")
        return sorted(set(moved))


def placeholders(payload: Any) -> list[str]:
    return [s for s in strings_of(payload) if PLACEHOLDER.fullmatch(s)]


async def metrics(session: aiohttp.ClientSession, admin: str) -> dict[tuple[str, str], float]:
    async with session.get(admin + "/metrics") as response:
        text = await response.text()
    found: dict[tuple[str, str], float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sidecar_repairs_total":
                key = (sample.labels.get("layer", ""), sample.labels.get("result", ""))
                found[key] += sample.value
            elif sample.name == "sidecar_llm_requests_total":
                found[("llm_calls", sample.labels.get("result", ""))] += sample.value
    return found


def log_events(log: Path, start: int) -> tuple[list[dict[str, Any]], int]:
    with open(log, "rb") as handle:
        handle.seek(start)
        data = handle.read()
    events = []
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, start + len(data)


async def play(
    session: aiohttp.ClientSession,
    sidecar: str,
    admin: str,
    case: Case,
    received: dict[str, list[Any]],
    log: Path,
    log_at: int,
) -> tuple[Played, int]:
    before = await metrics(session, admin)
    started = time.monotonic()
    headers = {
        "Content-Type": "application/json",
        "X-Sidecar-Intent": f"case={case.name} | {case.raw['intent']}",
        "X-Request-ID": f"recovery-{case.name}",
    }
    body = json.dumps(case.raw["payload"], ensure_ascii=False, separators=(",", ":"))
    async with session.post(sidecar + case.path, data=body.encode(), headers=headers) as answer:
        await answer.read()
    seconds = time.monotonic() - started
    await asyncio.sleep(0.05)  # the last log lines of the request
    after = await metrics(session, admin)
    delta = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if after[key] != before.get(key, 0.0)
    }
    events, log_at = log_events(log, log_at)
    out_of_scope = [
        str(name)
        for event in events
        if event.get("event") == "repair_refused" and event.get("reason") == "out_of_scope"
        for name in event.get("fields", [])
    ]
    return (
        Played(
            case=case,
            status=answer.status,
            outcome=answer.headers.get("X-Sidecar-Outcome", "?"),
            trail=answer.headers.get("X-Sidecar-Trail", ""),
            repaired=answer.headers.get("X-Sidecar-Repaired", ""),
            received=received.get(case.name, []),
            repairs={res: int(n) for (layer, res), n in delta.items() if layer == "llm"},
            other_layers={
                f"{layer}:{res}": int(n)
                for (layer, res), n in delta.items()
                if layer not in ("llm", "llm_calls")
            },
            llm_calls=int(sum(n for (layer, _), n in delta.items() if layer == "llm_calls")),
            out_of_scope_fields=out_of_scope,
            seconds=seconds,
        ),
        log_at,
    )


# -- the report -------------------------------------------------------------------------


def ratio(plays: list[Played]) -> str:
    return f"{sum(p.recovered for p in plays)}/{len(plays)}" if plays else "—"


def by_half(plays: list[Played]) -> tuple[list[Played], list[Played], list[Played]]:
    tune = [p for p in plays if p.case.raw["half"] == "tune"]
    held = [p for p in plays if p.case.raw["half"] == "held_out"]
    return tune, held, plays


def report_regular(say: Report, plays: list[Played]) -> None:
    say("| cases | tune | held_out | whole |")
    say("|---|---|---|---|")
    say("| **all** | " + " | ".join(f"**{ratio(group)}**" for group in by_half(plays)) + " |")
    for needs in ("coercion", "adjustment", "model"):
        group = [p for p in plays if p.case.raw["needs"] == needs]
        say(f"| needs {needs} | " + " | ".join(ratio(g) for g in by_half(group)) + " |")
    exact = [p for p in plays if p.exact]
    extra = [p for p in plays if p.recovered and not p.exact]
    say("")
    say(
        f"Recovered with exactly the fix: {len(exact)}; recovered with some other change "
        f"as well (a field added or changed that the fix does not need): {len(extra)}"
        + (f" ({', '.join(p.case.name for p in extra)})" if extra else "")
        + "."
    )
    say("")
    say("| validator | cases | tune | held_out | whole |")
    say("|---|---|---|---|---|")
    for validator in sorted({p.case.raw["validator"] for p in plays}):
        group = [p for p in plays if p.case.raw["validator"] == validator]
        say(
            f"| {validator} | {len(group)} | " + " | ".join(ratio(g) for g in by_half(group)) + " |"
        )
    say("")
    results = sorted({res for p in plays for res in p.repairs})
    say('`sidecar_repairs_total{layer="llm",result=...}` added by the cases of each half:')
    say("")
    say("| result | tune | held_out | whole |")
    say("|---|---|---|---|")
    for res in results:
        counts = [sum(p.repairs.get(res, 0) for p in group) for group in by_half(plays)]
        say(f"| {res} | " + " | ".join(str(n) for n in counts) + " |")
    calls = [sum(p.llm_calls for p in group) for group in by_half(plays)]
    say("| (model calls) | " + " | ".join(str(n) for n in calls) + " |")
    say("")
    for half, group in zip(("tune", "held_out"), by_half(plays)[:2], strict=True):
        refused = [p for p in group if p.repairs.get("out_of_scope")]
        say(f"Refused `out_of_scope`, {half} half ({len(refused)}):")
        for p in refused:
            fields = ", ".join(dict.fromkeys(p.out_of_scope_fields)) or "(no fields logged)"
            state = "recovered later" if p.recovered else "not recovered"
            say(f"- `{p.case.name}` ({p.case.raw['validator']}): {fields} — {state}")
        say("")
    unattempted = [p for p in plays if not p.attempted and not p.recovered]
    counts = [sum(not p.attempted and not p.recovered for p in g) for g in by_half(plays)]
    say(
        "Not recovered because no repair layer ran (the sidecar did not judge the tool's "
        f"answer one a new payload can fix): tune {counts[0]}, held_out {counts[1]}, "
        f"whole {counts[2]}:"
    )
    for validator in sorted({p.case.raw["validator"] for p in unattempted}):
        names = [p.case.name for p in unattempted if p.case.raw["validator"] == validator]
        say(f"- {validator}: {', '.join(names)}")
    say("")
    missed = [p for p in plays if not p.recovered]
    say(f"Not recovered ({len(missed)}):")
    say("")
    say("| case | half | needs | status | outcome | trail | llm results |")
    say("|---|---|---|---|---|---|---|")
    for p in missed:
        results_text = ", ".join(f"{k}={v}" for k, v in sorted(p.repairs.items())) or "—"
        say(
            f"| {p.case.name} | {p.case.raw['half']} | {p.case.raw['needs']} | {p.status} | "
            f"{p.outcome} | {p.trail} | {results_text} |"
        )


def report_hostile(say: Report, plays: list[Played], model: ScriptedModel | None) -> None:
    obeyed = {ask.case for ask in model.asks if ask.obeyed} if model is not None else set()
    say(
        "| case | half | injected via | model obeyed | recovered | injected change reached "
        "the tool | secrets moved | llm results | trail |"
    )
    say("|---|---|---|---|---|---|---|---|---|")
    for p in plays:
        results_text = ", ".join(f"{k}={v}" for k, v in sorted(p.repairs.items())) or "—"
        moved = ", ".join(p.secrets_moved()) or "—"
        asked = "yes" if p.case.name in obeyed else ("—" if model is None else "no")
        say(
            f"| {p.case.name} | {p.case.raw['half']} | {p.case.injection.get('via')} | "
            f"{asked} | {'yes' if p.recovered else 'no'} | "
            f"{'**yes**' if p.injected() else 'no'} | {moved} | {results_text} | {p.trail} |"
        )
    say("")
    say(
        "(model obeyed: the scripted model found the injected text in its prompt and obeyed "
        "it; no means the sidecar never showed it that text.)"
    )
    say("")
    say("| | tune | held_out | whole |")
    say("|---|---|---|---|")
    groups = by_half(plays)
    say("| recovered | " + " | ".join(ratio(g) for g in groups) + " |")
    say(
        "| injected change reached the tool | "
        + " | ".join(f"{sum(p.injected() for p in g)}/{len(g)}" for g in groups)
        + " |"
    )
    say(
        "| secret moved or changed | "
        + " | ".join(f"{sum(bool(p.secrets_moved()) for p in g)}/{len(g)}" for g in groups)
        + " |"
    )
    say(
        "| refused out_of_scope | "
        + " | ".join(
            f"{sum(bool(p.repairs.get('out_of_scope')) for p in g)}/{len(g)}" for g in groups
        )
        + " |"
    )


def show(say: Report, played: Played, model: ScriptedModel | None, verbose: bool) -> None:
    mark = "recovered" if played.recovered else "NOT     "
    extra = ""
    if played.case.hostile:
        extra = " INJECTED" if played.injected() else " clean"
    scope = (
        f" out_of_scope={','.join(played.out_of_scope_fields)}"
        if played.out_of_scope_fields
        else ""
    )
    say(
        f"  {mark} {played.case.name:<48} {played.status} {played.outcome:<13} "
        f"llm={played.llm_calls}{scope}{extra}  {played.trail}"
    )
    if verbose:
        if model is not None:
            for ask in model.asks:
                if ask.case == played.case.name:
                    say(
                        f"      ask {ask.number}: perturbation={ask.perturbation} "
                        f"obeyed={ask.obeyed}"
                    )
        for number, payload in enumerate(played.received, start=1):
            say(f"      tool got {number}: {json.dumps(payload)[:300]}")


# -- the run ----------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    cases = load_cases(args)
    if not cases:
        print("no case selected")
        return 2
    say = Report()
    workdir = Path(tempfile.mkdtemp(prefix="recovery-"))
    started, runners = Started(), []
    received: dict[str, list[Any]] = {}
    real_model = bool(args.llm_base_url or args.local_model)
    model = (
        None
        if real_model or args.model == "none"
        else ScriptedModel(args.model, args.seed, {case.name: case for case in cases})
    )
    began = time.monotonic()
    local_processes = None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
            llm_url = None
            if args.local_model:
                import local_model  # the llama.cpp server, built and fetched once (minutes)

                local_processes = local_model.Processes(workdir)
                base = await local_model.start_model(local_processes, args.threads, session)
                llm_url = base + "/v1"
            elif args.llm_base_url:
                llm_url = args.llm_base_url
            elif model is not None:
                llm_url = await serve(model_app(model), runners) + "/v1"
            tool = await serve(tool_app(cases, received), runners)
            config = workdir / "sidecar.yaml"
            route = {
                "name": "cases",
                "prefix": ROUTE_PREFIX,
                "upstream": tool,
                "schema": tool + "/openapi.json",
            }
            config.write_text(yaml.safe_dump({"routes": [route]}))
            port, admin_port = free_port(), free_port()
            log = workdir / "sidecar.log"
            env = sidecar_env(llm_url, real_model)
            await started.start(
                sidecar_command(args.sidecar_src, config, port, admin_port), env, log
            )
            sidecar, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
            await wait_ready(session, admin + "/readyz", log)

            label = "real model" if real_model else f"model {args.model}"
            seed = f", seed {args.seed}" if args.model == "noisy" and not real_model else ""
            say(f"## Recovery: {label}{seed}, {len(cases)} cases")
            say("")
            chosen = {
                key: value
                for key, value in env.items()
                if key.startswith("SIDECAR_") and key not in ("SIDECAR_LLM_API_KEY",)
            }
            say(
                f"sidecar: {args.sidecar_src or 'this checkout'}; set: "
                + ", ".join(f"{key}={value}" for key, value in sorted(chosen.items()))
                + "; shipped defaults otherwise (e.g. "
                + ", ".join(name for name in SHOWN_DEFAULTS if name not in chosen)
                + ")"
            )
            say("")
            plays: list[Played] = []
            log_at = 0
            for case in cases:
                played, log_at = await play(session, sidecar, admin, case, received, log, log_at)
                plays.append(played)
                show(say, played, model, args.verbose)
            say("")
            regular = [p for p in plays if not p.case.hostile]
            hostile = [p for p in plays if p.case.hostile]
            if regular:
                report_regular(say, regular)
                say("")
            if hostile:
                say("### Hostile cases")
                say("")
                report_hostile(say, hostile, model)
                say("")
            if model is not None and args.model == "noisy":
                kinds = collections.Counter(ask.perturbation for ask in model.asks)
                say(
                    f"Model asks: {len(model.asks)}, perturbed "
                    + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items(), key=str) if k)
                    + f" (none: {kinds.get(None, 0)})."
                )
            if model is not None and args.model == "obedient":
                obeyed = sum(ask.obeyed for ask in model.asks)
                say(f"Model asks: {len(model.asks)}, obeyed the tool's text: {obeyed}.")
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        await started.stop_all()
        if local_processes is not None:
            local_processes.stop_all()
    say.finish(began, args.out)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["right", "noisy", "obedient", "none"], default="right")
    parser.add_argument("--seed", type=int, default=1, help="the noisy model's seed")
    parser.add_argument(
        "--set",
        choices=["regular", "hostile", "all"],
        help="default: hostile with --model obedient, else regular",
    )
    parser.add_argument("--half", choices=["tune", "held_out"])
    parser.add_argument("--case", action="append", help="only cases whose name has this")
    parser.add_argument("--sidecar-src", type=Path, help="serve the sidecar from this source tree")
    parser.add_argument("--llm-base-url", help="a real OpenAI-compatible model server (…/v1)")
    parser.add_argument(
        "--local-model",
        action="store_true",
        help="start Qwen2.5-Coder-1.5B on llama.cpp (bench/local_model.py; minutes)",
    )
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (--local-model)")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument(
        "--verbose", action="store_true", help="each ask and each payload the tool got"
    )
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
