"""The repair corpus against the scope of a repair: how many right fixes it lets through.

    python -m bench.repair_scope    (from the repository root)

Each case of ``bench/repair_corpus.json`` is answered, as a scripted model would, with its
right fix (every condition of ``fixed`` met, every other field kept); the fix counts when
the scope its tool's answer sets (``sidecar/repair/scope.py``) holds every field it touches.
The corpus is split in two halves by a fixed rule: the cases at an even index (0, 2, …) are
the half the scope's rules were worked out on, those at an odd index the held-out half,
read only to report. Pure: no socket, no model, no timing.
"""

from __future__ import annotations

from tests.test_repair_scope import CORPUS, outside_of_case


def main() -> None:
    cases = CORPUS["cases"]
    halves = {
        "even (worked on)": cases[0::2],
        "odd (held out)": cases[1::2],
        "whole": cases,
    }
    for name, half in halves.items():
        refused = {case["name"]: outside_of_case(case) for case in half}
        refused = {case: fields for case, fields in refused.items() if fields}
        kept = len(half) - len(refused)
        print(f"{name:18} {kept}/{len(half)} in scope")
        for case, fields in refused.items():
            print(f"{'':18}   refused: {case} touches {', '.join(fields)}")


if __name__ == "__main__":
    main()
