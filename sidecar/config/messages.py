"""What a reader is told about a configuration problem, in one line each.

``describe`` turns a validation error into the line a ``ConfigError`` carries, naming
each failing field where it was written and never its value. ``unknown_variables``
finds the ``SIDECAR_*`` variables no setting reads. Both suggest the name most likely meant.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sidecar.build import BUILD_SETTING
from sidecar.config.model import ENV_PREFIX, TUNING_FIELDS, RouteSpec, Settings
from sidecar.config.sources import FOREIGN_VARIABLES


def describe(exc: ValidationError, prefix: str = "", given: Mapping[str, Any] | None = None) -> str:
    """One line naming each failing field where it was written, and why; input values are
    never shown. ``given`` holds the settings passed in code (the command line's flags)."""
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(part) for part in error["loc"] if part != "overrides")
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            problems.append(_unknown_key(error["loc"]))
        elif not loc:
            problems.append(message)
        elif prefix or "." in loc or not loc.isidentifier():
            problems.append(f"{prefix}{loc}: {message}")
        else:
            problems.append(f"{_written_as(loc, given or {})}: {message}")
    return "configuration error: " + "; ".join(problems)


def _written_as(field: str, given: Mapping[str, Any]) -> str:
    """A top-level setting as its reader wrote it: with the variable that held it, or as a
    key of the config file, the one source left when no variable holds it."""
    variable = ENV_PREFIX + field.upper()
    if given.get(field) is not None or variable in {
        name.upper() for name, value in os.environ.items() if value
    }:
        return f"{field} ({variable})"
    for name, target in FOREIGN_VARIABLES.items():
        if target == field and name in os.environ:
            return f"{field} ({name})"
    return f"{field} in the config file"


def _unknown_key(loc: tuple[str | int, ...]) -> str:
    """An unknown key can only come from the file (the environment is read by name)."""
    key = str(loc[-1])
    if len(loc) == 1:
        meant = _closest(key, [name for name in Settings.model_fields if name != "config_file"])
        hint = f"; did you mean {meant} ({ENV_PREFIX}{meant.upper()})?" if meant else ""
        return f"{key} in the config file is not a setting{hint}"
    route_keys = [
        field.alias or name for name, field in RouteSpec.model_fields.items() if name != "overrides"
    ]
    meant = _closest(key, [*route_keys, *TUNING_FIELDS])
    hint = f"; did you mean {meant}?" if meant else ""
    return f"{'.'.join(str(part) for part in loc)} is not a route setting{hint}"


@dataclass(frozen=True, slots=True)
class UnknownVariable:
    """A ``SIDECAR_*`` environment variable that names no setting, so nothing reads it."""

    name: str
    suggestion: str | None

    def __str__(self) -> str:
        hint = f"; did you mean {self.suggestion}?" if self.suggestion else ""
        return f"{self.name} is not a setting and is ignored{hint}"


def unknown_variables(environ: Mapping[str, str]) -> list[UnknownVariable]:
    """The ``SIDECAR_*`` variables in ``environ`` that no setting reads, each with the
    setting it most likely meant."""
    unknown = []
    for name in sorted(environ):
        field = name.upper().removeprefix(ENV_PREFIX).lower()
        if name.upper() == BUILD_SETTING:
            continue  # read by the build, not by a running sidecar
        if name.upper().startswith(ENV_PREFIX) and field not in Settings.model_fields:
            meant = _closest(field, Settings.model_fields)
            unknown.append(UnknownVariable(name, meant and ENV_PREFIX + meant.upper()))
    return unknown


# How alike a mistyped name and some run of a setting name's words must be to be suggested.
_SUGGEST_CUTOFF = 0.8


def _closest(word: str, candidates: Collection[str]) -> str | None:
    """The candidate ``word`` most likely meant, or None when none is alike.

    Beside the whole names, ``word`` is compared with each run of a name's
    ``_``-separated words, singular and plural alike, and counts as alike when its words
    all appear in the name in order: ``retrys`` is the ``retries`` of ``max_retries`` and
    ``llm_key`` is ``llm_api_key``, which a comparison of whole names alone misses. Ties go
    to the closer whole name.
    """
    typed = _stem(word.lower())

    def likeness(candidate: str) -> tuple[float, float]:
        whole = difflib.SequenceMatcher(None, word.lower(), candidate).ratio()
        words = _stem(candidate).split("_")
        if _in_order(typed.split("_"), words):
            return 1.0, whole
        runs = [
            "_".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)
        ]
        return max(difflib.SequenceMatcher(None, typed, run).ratio() for run in runs), whole

    scored = {candidate: likeness(candidate) for candidate in candidates}
    best = max(scored, key=scored.__getitem__, default=None)
    return best if best is not None and max(scored[best]) >= _SUGGEST_CUTOFF else None


def _in_order(words: list[str], within: list[str]) -> bool:
    """Whether ``words`` all appear in ``within``, in the same order."""
    remaining = iter(within)
    return all(word in remaining for word in words)


def _stem(name: str) -> str:
    """``name`` with each word made singular the simple way (``retries`` -> ``retry``)."""
    return "_".join(
        word[:-3] + "y"
        if word.endswith("ies")
        else word[:-1]
        if word.endswith("s") and not word.endswith("ss")
        else word
        for word in name.split("_")
    )
