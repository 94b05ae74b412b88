"""Secrets out of what the LLM sees, and back into what it returns.

A value is secret when its field name looks secret (password, token, api_key, …), or when
it sits inside a string as URL userinfo, a URL query credential (``appid=…``, ``key=…``)
or an HTTP credential (``Bearer …``): ``sidecar.credentials``'s rule, which the logs
follow too. Each distinct secret becomes a stable placeholder; ``restore`` puts the real
values back wherever the model kept a placeholder.
"""

from __future__ import annotations

from typing import Any

from sidecar.credentials import is_secret_name, mask_credentials

# Shorter secret values (a 4-digit PIN) would match ordinary text far too often.
_MIN_ECHOED_SECRET = 6


class Redactor:
    """Replaces secrets with placeholders for one prompt, and restores them afterwards."""

    def __init__(self) -> None:
        self._placeholders: dict[str, str] = {}  # secret text -> placeholder
        self._originals: dict[str, Any] = {}  # placeholder -> the value as it was
        # Names of the fields whose value holds a placeholder: the model must be free to
        # write it there, whatever rule the tool's schema sets for the real value.
        self.redacted_names: set[str] = set()

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
        for secret, placeholder in self._placeholders.items():
            if len(secret) >= _MIN_ECHOED_SECRET:
                text = text.replace(secret, placeholder)
        return text

    def restore(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self.restore(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.restore(item) for item in value]
        if isinstance(value, str):
            if value in self._originals:
                return self._originals[value]
            # Newest first: a later secret may hold an earlier placeholder (a query value
            # holding a URL whose userinfo was already replaced).
            for secret, placeholder in reversed(self._placeholders.items()):
                value = value.replace(placeholder, secret)
        return value

    def _placeholder(self, secret: str) -> str:
        if secret not in self._placeholders:
            self._placeholders[secret] = f"<redacted-{len(self._placeholders) + 1}>"
        return self._placeholders[secret]
