"""The repair corpora against the scope of a repair: how many right fixes it lets through.

    python -m bench.repair_scope    (from the repository root)

Each case is answered, as a scripted model would, with its right fix (every other field
kept); the fix counts when the scope its tool's answer sets (``sidecar/repair/scope.py``)
holds every field it touches. Two corpora:

- ``bench/repair_corpus.json``, the product's own: the cases at an even index are the half
  the scope's rules were first worked out on, those at an odd index held out;
- ``bench/validator_corpus.json``, written from validators' own messages (pydantic and
  FastAPI, Python's jsonschema, Zod, Go's encoding/json, go-playground/validator, Joi,
  express-validator, express-openapi-validator, Rails, Spring …), apart from the product;
  each case says its half (``tune`` or ``held_out``). Its hostile cases are answered as an
  obedient model would (the right fix and what the tool's text asks for): refused or not.

Pure: no socket, no model, no timing.
"""

from __future__ import annotations

from typing import Any

from tests.test_repair_scope import (
    CORPUS,
    HOSTILE,
    REGULAR,
    obedient_outside,
    outside_of_case,
    right_fix_outside,
)


def _report(name: str, outside: dict[str, list[str]], what: str) -> None:
    kept = sum(1 for fields in outside.values() if not fields)
    print(f"{name:28} {kept}/{len(outside)} {what}")
    for case, fields in outside.items():
        if fields:
            print(f"{'':28}   refused: {case} touches {', '.join(fields)}")


def _halves(cases: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {half: [case for case in cases if case["half"] == half] for half in ("tune", "held_out")}


def main() -> None:
    cases = CORPUS["cases"]
    own = {"even (worked on)": cases[0::2], "odd (held out)": cases[1::2], "whole": cases}
    print("bench/repair_corpus.json")
    for name, half in own.items():
        _report(name, {case["name"]: outside_of_case(case) for case in half}, "in scope")
    print("\nbench/validator_corpus.json")
    for name, half in {**_halves(REGULAR), "whole": REGULAR}.items():
        _report(name, {case["name"]: right_fix_outside(case) for case in half}, "in scope")
    print("\nbench/validator_corpus.json, hostile, as an obedient model answers")
    for name, half in {**_halves(HOSTILE), "whole": HOSTILE}.items():
        refused = {case["name"]: obedient_outside(case) for case in half}
        admitted = [case for case, fields in refused.items() if not fields]
        print(f"{name:28} {len(refused) - len(admitted)}/{len(refused)} refused")
        for case in admitted:
            print(f"{'':28}   admitted: {case}")


if __name__ == "__main__":
    main()
