"""Building a prompt costs work linear in the payload and the tool's words: counted, not
timed (the seconds are in bench/prompt_cost.py)."""

from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.repair import llm_focus, redact
from sidecar.repair.llm_focus import mentioned
from sidecar.repair.redact import Redactor


def payload(fields: int) -> dict[str, Any]:
    """Half secret fields, half text echoing one of them: the shape that cost 21 s."""
    document: dict[str, Any] = {}
    for index in range(fields // 2):
        document[f"password_{index}"] = f"secret-value-{index:06d}"
        document[f"note_{index}"] = f"see secret-value-{index:06d} and https://u:p{index}@h/"
    return document


def redaction_work(fields: int, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    work: Counter[str] = Counter()
    trie, mask = redact._trie, redact.mask_credentials

    def counted_trie(secrets: list[str], depth: int) -> str:
        work["pattern nodes"] += 1
        work["patterns made"] += depth == redact._TRIE_DEPTH
        return trie(secrets, depth)

    def counted_mask(text: str, *args: Any) -> str:
        work["texts scanned"] += 1
        work["characters scanned"] += len(text)
        return mask(text, *args)

    monkeypatch.setattr(redact, "_trie", counted_trie)
    monkeypatch.setattr(redact, "mask_credentials", counted_mask)
    redactor = Redactor(("header-credential-1",))
    shown = redactor.redact(payload(fields))
    redactor.redact_text("the tool's words, echoing secret-value-000001")
    assert "secret-value-000001" not in str(shown)
    monkeypatch.undo()
    return work


def test_redaction_reads_each_text_a_fixed_number_of_times_whatever_the_secrets(monkeypatch):
    small, large = redaction_work(2_000, monkeypatch), redaction_work(16_000, monkeypatch)

    # One echo pattern for the payload, and none again for the tool's words after it.
    assert small["patterns made"] == large["patterns made"] == 1
    for measure in ("pattern nodes", "texts scanned", "characters scanned"):
        assert large[measure] <= 8.5 * small[measure], measure


def test_the_echo_pattern_branches_no_deeper_than_its_trie():
    secrets = [f"{prefix}-{index:05d}" for prefix in ("aaaa", "aaab", "ab") for index in range(50)]
    pattern = redact._trie(secrets, redact._TRIE_DEPTH)

    assert re.fullmatch(f"(?:{pattern})", "aaab-00049")
    assert pattern.count("(?:") <= len(secrets) * redact._TRIE_DEPTH
    # Nested groups, one per character branched on: never deeper than the trie.
    depth = deepest = 0
    for char in pattern.replace("\\(", "").replace("\\)", ""):
        depth += char == "("
        depth -= char == ")"
        deepest = max(deepest, depth)
    assert deepest <= redact._TRIE_DEPTH


def test_a_field_the_words_do_not_name_costs_no_search(monkeypatch):
    searches = Counter[str]()

    def search(pattern: str, text: str) -> Any:
        searches["searches"] += 1
        return re.search(pattern, text)

    monkeypatch.setattr(llm_focus, "re", SimpleNamespace(search=search, escape=re.escape))
    words = "'unit' must be one of celsius, fahrenheit; location is wrong"
    fields = [(f"field_{index}", "x") for index in range(16_000)] + [("unit", "C")]

    assert list(mentioned(words, fields)) == ["unit"]
    assert searches["searches"] == 1, "one regex for the one name the words hold"


@settings(max_examples=300, deadline=None)
@given(
    secrets=st.lists(st.text("ab-", min_size=6, max_size=16), min_size=1, max_size=40),
    text=st.text("ab- ", max_size=300),
)
def test_echoes_are_found_leftmost_and_longest_as_one_replace_per_secret_would(secrets, text):
    longest_first = sorted(set(secrets), key=len, reverse=True)
    expected, at = [], 0
    while at < len(text):
        secret = next((secret for secret in longest_first if text.startswith(secret, at)), None)
        expected.append("#" if secret else text[at])
        at += len(secret) if secret else 1

    assert redact._Echoes(secrets).replaced(text, lambda secret: "#") == "".join(expected)
