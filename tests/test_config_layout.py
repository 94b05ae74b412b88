"""The configuration package's shape: pure modules use its value types without loading
pydantic or the loader, and each name the package offers resolves to its owner's."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import sidecar.config

# Modules that decide from plain values and must stay cheap to import.
PURE_MODULES = ("sidecar.retry.policy", "sidecar.retry.controls")


def test_pure_modules_do_not_load_pydantic_or_the_loader():
    script = (
        f"import sys, {', '.join(PURE_MODULES)}\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'sidecar.config.'))))"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)

    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['sidecar.config.values']"


def test_each_public_name_resolves_and_is_typed_from_its_owner():
    source = Path(sidecar.config.__file__).read_text(encoding="utf-8")
    typed = {
        alias.asname or alias.name: node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module and ".config." in node.module
        for alias in node.names
    }

    assert set(typed) == set(sidecar.config.__all__)
    for name, module in typed.items():
        assert getattr(sidecar.config, name) is getattr(importlib.import_module(module), name)
