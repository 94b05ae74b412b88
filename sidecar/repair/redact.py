"""Secrets out of what the LLM sees, and back into what it returns.

A value is secret when its field name looks secret (password, token, api_key, …), or when
it sits inside a string as URL userinfo, a URL query credential (``appid=…``, ``key=…``)
or an HTTP credential (``Bearer …``): ``sidecar.credentials``'s rule, which the logs
follow too. Each distinct secret becomes a stable placeholder; ``restore`` puts the real
values back wherever the model kept a placeholder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from multidict import MultiMapping

from sidecar.credentials import is_secret_name, mask_credentials

# Shorter secret values (a 4-digit PIN) would match ordinary text far too often.
_MIN_ECHOED_SECRET = 6
# The echo pattern's shape: a trie that branches until a branch holds this few secrets,
# tried in turn, and nests no deeper than ``_TRIE_DEPTH`` groups (Python's regex parser
# recurses once a group).
_TRIED_IN_TURN = 8
_TRIE_DEPTH = 24
# How much of each secret the echo pattern holds; the rest is checked in a set.
_KEY = 12
_COOKIE_PAIRS = re.compile(r"[;,]\s*")
_PLACEHOLDER = re.compile(r"<redacted-\d+>")
# How deep a secret holding another's placeholder is put back: a secret is redacted before
# the text around it, so real nesting is one or two deep.
_MAX_NESTING = 8
# How many times over the secrets' own text a restore may put back, as the answer's size
# guard lets a payload grow (``llm_answer.MAX_GROWTH``): an agent's secret that holds
# placeholders' text, put back into itself, would otherwise grow as a power of its copies.
_PUT_BACK_GROWTH = 4
_PUT_BACK_FLOOR = 4096


def sent_secrets(headers: Mapping[str, str], query: MultiMapping[str]) -> tuple[str, ...]:
    """The credentials the agent sent: the value of each header and query parameter with a
    secret-looking name (``X-Api-Key``, ``Cookie``, ``private_key``, ``jwt``), and each part
    of it (a cookie's value, the token after ``Bearer``), to be masked wherever they appear.
    """
    found: list[str] = []
    for name, value in (*headers.items(), *query.items()):
        if not is_secret_name(name):
            continue
        found.append(value)
        if "=" in value:  # a cookie's pairs
            found.extend(pair.partition("=")[2] for pair in _COOKIE_PAIRS.split(value))
        else:  # a credential after its scheme: "Bearer <token>"
            found.append(value.rpartition(" ")[2])
    return tuple(dict.fromkeys(part for part in found if len(part) >= _MIN_ECHOED_SECRET))


class PutBackTooLarge(ValueError):
    """A restore would put back more text than the secrets could honestly fill."""


def _spend(budget: list[int], secret: str, placeholder: str) -> None:
    """``secret`` put back for ``placeholder``, paid from ``budget``: a model that writes a
    placeholder in ten thousand fields must not make a payload of ten thousand secrets."""
    budget[0] -= len(secret)
    if budget[0] < 0:
        raise PutBackTooLarge(placeholder)


class Redactor:
    """Replaces secrets with placeholders for one prompt, and restores them afterwards."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self._placeholders: dict[str, str] = {}  # secret text -> placeholder
        self._originals: dict[str, Any] = {}  # placeholder -> the value as it was
        self._secrets: dict[str, str] = {}  # placeholder -> its secret text
        # Names of the fields whose value holds a placeholder: the model must be free to
        # write it there, whatever rule the tool's schema sets for the real value.
        self.redacted_names: set[str] = set()
        # Every secret long enough to look for in text, as one pattern; made again only
        # when a secret was learnt since (a few times a prompt, not once a string).
        self._echoes: _Echoes | None = None
        self._echoes_of = -1
        # The secrets looked for in text: those learnt, and the agent's own credentials,
        # which get a placeholder only where they are found.
        self._echoable = dict.fromkeys(
            secret for secret in known if len(secret) >= _MIN_ECHOED_SECRET
        )

    def redact(self, value: Any, name: str = "") -> Any:
        """``value`` with every secret in it replaced. The secrets its field names mark are
        learnt first: one written into another field before its own is hidden there too."""
        self._learn(value, name)
        return self._redacted(value, name)

    def _learn(self, value: Any, name: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                self._learn(item, str(key))
        elif isinstance(value, list):
            for item in value:
                self._learn(item, name)
        elif name and is_secret_name(name) and value is not None and not isinstance(value, bool):
            self._placeholder(value if isinstance(value, str) else str(value))
        elif isinstance(value, str):
            # The credentials inside strings too: all known before any text is redacted, the
            # echo pattern is made once, not again for each string that holds a new one.
            mask_credentials(value, self._placeholder)

    def _redacted(self, value: Any, name: str) -> Any:
        if isinstance(value, dict):
            return {key: self._redacted(item, str(key)) for key, item in value.items()}
        if isinstance(value, list):
            return [self._redacted(item, name) for item in value]
        if name and is_secret_name(name) and value is not None and not isinstance(value, bool):
            placeholder = self._placeholder(value if isinstance(value, str) else str(value))
            self._originals.setdefault(placeholder, value)
            self.redacted_names.add(name)
            return placeholder
        if isinstance(value, str):
            redacted = self.redact_text(value)
            if name and redacted != value:
                self.redacted_names.add(name)
            return redacted
        return value

    def redact_text(self, text: str) -> str:
        """Credentials inside free text (a URL, an error message) replaced.

        Besides the credential patterns, every secret already seen is replaced wherever it
        appears: a tool that echoes the payload's API key in its error message must not
        carry it into the prompt.
        """
        text = mask_credentials(text, self._placeholder)
        echoes = self._echo_pattern()
        return text if echoes is None else echoes.replaced(text, self._placeholder)

    def _echo_pattern(self) -> _Echoes | None:
        """Every secret known, to look for in text: made again only when one was learnt."""
        if self._echoes_of != len(self._echoable):
            self._echoes_of = len(self._echoable)
            self._echoes = _Echoes(self._echoable) if self._echoable else None
        return self._echoes

    def restore(self, value: Any) -> Any:
        """``value`` (the model's payload) with each placeholder put back; raises
        ``PutBackTooLarge`` past ``_PUT_BACK_GROWTH`` times the secrets' text."""
        budget = [_PUT_BACK_GROWTH * (sum(map(len, self._secrets.values())) + _PUT_BACK_FLOOR)]
        return self._restored(value, budget)

    def _restored(self, value: Any, budget: list[int]) -> Any:
        if isinstance(value, dict):
            return {key: self._restored(item, budget) for key, item in value.items()}
        if isinstance(value, list):
            return [self._restored(item, budget) for item in value]
        if isinstance(value, str):
            if value in self._originals:
                _spend(budget, self._secrets[value], value)
                return self._originals[value]
            return self._restored_text(value, budget)
        return value

    def _restored_text(self, text: str, budget: list[int], depth: int = 0) -> str:
        """``text`` with each placeholder in it put back, in one pass: a secret may hold an
        earlier placeholder (a query value holding a URL whose userinfo was replaced first),
        put back in turn. A placeholder no secret has (a model's invention) stays as it is
        written; so does one past ``_MAX_NESTING``, which only a payload that holds
        placeholders' own text can reach. ``budget`` holds the characters still allowed."""
        if "<redacted-" not in text or depth > _MAX_NESTING:
            return text

        def put_back(found: re.Match[str]) -> str:
            secret = self._secrets.get(found[0])
            if secret is None:
                return found[0]
            _spend(budget, secret, found[0])
            return self._restored_text(secret, budget, depth + 1)

        return _PLACEHOLDER.sub(put_back, text)

    def _placeholder(self, secret: str) -> str:
        if secret not in self._placeholders:
            placeholder = f"<redacted-{len(self._placeholders) + 1}>"
            self._placeholders[secret] = placeholder
            self._secrets[placeholder] = secret
            if len(secret) >= _MIN_ECHOED_SECRET:
                self._echoable.setdefault(secret)
        return self._placeholders[secret]


class _Echoes:
    """Secrets found in text in one pass, wherever they appear, the longest first.

    One ``str.replace`` per secret made redaction cost (secrets × text): 21 s for a
    16,000-field payload. One regular expression of the secrets reads a text once, but
    Python compiles one at about 5 µs a character: 2.7 s for 8,000 secrets of 60. So the
    expression holds only each secret's first ``_KEY`` characters, shaped as a trie (each
    position costs a few character tests, whatever the number of secrets), and a key found
    is checked against the secrets that start with it, by length, in a set.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        groups: dict[str, set[str]] = {}
        for secret in secrets:
            groups.setdefault(secret[:_KEY], set()).add(secret)
        self._by_key = {
            key: (sorted({len(secret) for secret in group}, reverse=True), frozenset(group))
            for key, group in groups.items()
        }
        self._pattern = re.compile(_trie(list(groups), _TRIE_DEPTH))

    def replaced(self, text: str, placeholder: Callable[[str], str]) -> str:
        """``text`` with each secret in it replaced by ``placeholder(secret)``."""
        pieces: list[str] = []
        kept = at = 0
        while (found := self._pattern.search(text, at)) is not None:
            start = found.start()
            secret = self._secret_at(text, start, found[0])
            if secret is None:
                at = start + 1
                continue
            pieces += (text[kept:start], placeholder(secret))
            kept = at = start + len(secret)
        if not pieces:
            return text
        pieces.append(text[kept:])
        return "".join(pieces)

    def _secret_at(self, text: str, start: int, key: str) -> str | None:
        """The longest secret at ``start`` of those whose key is ``key`` or starts it (a
        key shorter than ``_KEY`` is a whole secret)."""
        for size in range(len(key), _MIN_ECHOED_SECRET - 1, -1):
            group = self._by_key.get(key[:size])
            if group is None:
                continue
            lengths, secrets = group
            for length in lengths:
                if text[start : start + length] in secrets:
                    return text[start : start + length]
        return None


def _trie(secrets: list[str], depth: int) -> str:
    """An alternation matching each of ``secrets``, the longest where one starts another,
    shaped as a trie: their common start once, then a branch per next character, until a
    branch holds few enough to try in turn, or ``depth`` groups are nested."""
    if len(secrets) <= _TRIED_IN_TURN or depth == 0:
        return "|".join(re.escape(secret) for secret in sorted(secrets, key=len, reverse=True))
    # What the first and the last in order share, all share; the first is the shorter
    # when one starts the other.
    low, high = min(secrets), max(secrets)
    pairs = enumerate(zip(low, high, strict=False))
    shared = next((at for at, (a, b) in pairs if a != b), len(low))
    common = low[:shared]
    tails = [secret[len(common) :] for secret in secrets]
    longer = [tail for tail in tails if tail]
    if common:
        inner = _trie(longer, depth - 1) if longer else ""
        # A secret that ends where others go on: theirs are tried first, greedily.
        optional = "?" if len(longer) < len(tails) else ""
        return re.escape(common) + (f"(?:{inner}){optional}" if inner else "")
    by_first: dict[str, list[str]] = {}
    for tail in tails:
        by_first.setdefault(tail[0], []).append(tail[1:])
    return "|".join(_branch(first, rest, depth) for first, rest in by_first.items())


def _branch(first: str, rests: list[str], depth: int) -> str:
    """The branch of the secrets starting with ``first``, followed by ``rests``."""
    longer = [rest for rest in rests if rest]
    if not longer:
        return re.escape(first)
    optional = "?" if len(longer) < len(rests) else ""
    return re.escape(first) + f"(?:{_trie(longer, depth - 1)}){optional}"
