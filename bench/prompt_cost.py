"""What building one LLM prompt costs, in seconds, for the payloads and answers that once
held the event loop: a 16,000-field payload, a tool answer with 7,000 details, and a payload
of ``SIDECAR_MAX_BODY_BYTES`` (10 MiB).

    mkdir -p /tmp/before && git archive 5894ebb sidecar | tar -x -C /tmp/before
    python bench/prompt_cost.py --sidecar-src /tmp/before     # the tree before
    python bench/prompt_cost.py                               # this tree

Each case runs in a child process of its own (``--timeout`` seconds at most, then it is
stopped by its PID and reported as ``> timeout``): ``opening`` (the redacted document and
its turns, what every tree builds), and in a tree that has them the scope of the answer and
the payload size gate, which in this tree keep a payload past 64 KiB out of any prompt.
Not part of the suite; the counts that make it linear are pinned in
tests/test_prompt_linear.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
from sidecar.repair.llm_prompt import LlmRequest, opening
from sidecar.repair.redact import Redactor
from sidecar.tool.envelopes import ToolFailure

case = sys.argv[1]

def fields(count, value_bytes):
    payload = {}
    for index in range(count // 2):
        payload[f"password_{index}"] = f"tok-{index:08d}-" + "k" * (value_bytes - 13)
        payload[f"note_{index}"] = f"note {index} " + "n" * (value_bytes - 11)
    return payload

if case == "16000-fields":
    payload, details = fields(16_000, 64), {"field": "note_1"}
elif case == "7000-details":
    payload = {"location": "Flower Mound, TX"}
    details = {f"f{index}": f"bad {index}" for index in range(7000)}
else:  # the largest body the contract allows: SIDECAR_MAX_BODY_BYTES, 10 MiB
    payload, details = fields(124_000, 64), {"field": "note_1"}
body = json.dumps(payload)
failure = ToolFailure("gomind", "BAD", "note_1 is wrong", "INPUT_ERROR", True, details)
request = LlmRequest("POST", "r", "/p", "/p", 422, failure, "", payload, None, 1, None, ())
started = time.perf_counter()
try:
    from sidecar.repair.llm_prompt import MAX_PROMPT_PAYLOAD_BYTES
    gated = len(body.encode()) > MAX_PROMPT_PAYLOAD_BYTES
except ImportError:
    gated = None
gate_s = time.perf_counter() - started
started = time.perf_counter()
redactor = Redactor()
opening(request, redactor)
opening_s = time.perf_counter() - started
scope_s = None
try:
    from sidecar.repair.scope import Scope
    started = time.perf_counter()
    Scope.of(request, redactor)
    scope_s = time.perf_counter() - started
except ImportError:
    pass
print(json.dumps({"bytes": len(body), "gated": gated, "gate_s": gate_s,
                  "opening_s": opening_s, "scope_s": scope_s}))
"""

CASES = ("16000-fields", "7000-details", "10MiB-payload")


def run(case: str, source: Path, timeout_s: float) -> dict[str, object] | None:
    env = {**os.environ, "PYTHONPATH": str(source)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, case],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=source,  # the tree measured, not this one, is first on the path
    )
    try:
        out, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()  # by the PID this script started
        child.wait()
        return None
    result: dict[str, object] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecar-src", type=Path, default=ROOT)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    print(f"tree {args.sidecar_src}")
    print(f"{'case':14} {'bytes':>10} {'gated':>6} {'opening s':>10} {'scope s':>8}")
    for case in CASES:
        result = run(case, args.sidecar_src, args.timeout)
        if result is None:
            print(f"{case:14} {'':>10} {'':>6} {'> ' + str(int(args.timeout)):>10}")
            continue
        scope = result["scope_s"]
        print(
            f"{case:14} {result['bytes']:>10} {result['gated']!s:>6} "
            f"{result['opening_s']:>10.3f} {'' if scope is None else f'{scope:.3f}':>8}"
        )


if __name__ == "__main__":
    main()
