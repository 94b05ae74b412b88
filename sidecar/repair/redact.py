"""Secrets out of what the LLM sees, and back into what it returns.

A value is secret when its field name looks secret (password, token, api_key, …), or when
it sits inside a string as URL userinfo, a URL query credential (``appid=…``, ``key=…``)
or an HTTP credential (``Bearer …``): ``sidecar.credentials``'s rule, which the logs
follow too. Each distinct secret becomes a stable placeholder; ``restore`` puts the real
values back wherever the model kept a placeholder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from multidict import MultiMapping

from sidecar.credentials import is_secret_name, mask_credentials

# Shorter secret values (a 4-digit PIN) would match ordinary text far too often.
_MIN_ECHOED_SECRET = 6
# How many leading characters the echo pattern branches on, one group per character: past
# them, the secrets left are few, and tried in turn. Every secret is longer than this, so
# each branch holds a whole secret's tail, and the pattern never nests deeper than this.
_TRIE_DEPTH = 4
_COOKIE_PAIRS = re.compile(r"[;,]\s*")
_PLACEHOLDER = re.compile(r"<redacted-\d+>")


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
        self._echoes: re.Pattern[str] | None = None
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
        if echoes is None:
            return text
        return echoes.sub(lambda found: self._placeholder(found[0]), text)

    def _echo_pattern(self) -> re.Pattern[str] | None:
        """One pattern for every secret known, longest first where one starts another.

        One ``str.replace`` per secret made redaction cost (secrets × text): 21 s for a
        16,000-field payload. The secrets as one alternation would cost the same inside
        the regex engine, which tries each alternative at each position; shaped as a trie
        on their first characters, each position costs a few character tests whatever the
        number of secrets, so a text is read in one pass.
        """
        if self._echoes_of != len(self._echoable):
            self._echoes_of = len(self._echoable)
            echoed = list(self._echoable)
            self._echoes = re.compile(_trie(echoed, _TRIE_DEPTH)) if echoed else None
        return self._echoes

    def restore(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self.restore(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.restore(item) for item in value]
        if isinstance(value, str):
            if value in self._originals:
                return self._originals[value]
            return self._restored_text(value)
        return value

    def _restored_text(self, text: str) -> str:
        """``text`` with each placeholder in it put back, in one pass: a secret may hold an
        earlier placeholder (a query value holding a URL whose userinfo was replaced first),
        put back in turn."""
        if "<redacted-" not in text:
            return text
        return _PLACEHOLDER.sub(
            lambda found: self._restored_text(self._secrets.get(found[0], found[0])), text
        )

    def _placeholder(self, secret: str) -> str:
        if secret not in self._placeholders:
            placeholder = f"<redacted-{len(self._placeholders) + 1}>"
            self._placeholders[secret] = placeholder
            self._secrets[placeholder] = secret
            if len(secret) >= _MIN_ECHOED_SECRET:
                self._echoable.setdefault(secret)
        return self._placeholders[secret]


def _trie(secrets: list[str], depth: int) -> str:
    """An alternation matching each of ``secrets``, branching on their first ``depth``
    characters; each is longer than ``depth``, so no branch is left empty."""
    if depth == 0 or len(secrets) == 1:
        return "|".join(re.escape(secret) for secret in sorted(secrets, key=len, reverse=True))
    by_first: dict[str, list[str]] = {}
    for secret in secrets:
        by_first.setdefault(secret[0], []).append(secret[1:])
    return "|".join(
        re.escape(first) + "(?:" + _trie(tails, depth - 1) + ")"
        for first, tails in by_first.items()
    )
