"""The package's shape: small modules, short functions, few modules at its top, and
imports that point down the layers of docs/architecture.md.

No module over 400 lines and no function over 50 (its docstring included) anywhere in
``sidecar/`` but the demo package, and at most ten modules directly in ``sidecar/``; no
class name defined twice anywhere in ``sidecar/`` (one name per concept, as
docs/glossary.md lists them). Each failure names every offender, so one run shows all
that is left to split.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sidecar"
# The demo is a walkthrough read top to bottom, so its steps may stay in one place.
EXEMPT = PACKAGE / "demo"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
MAX_TOP_LEVEL_MODULES = 10


def modules() -> Iterator[Path]:
    """Every module of the package outside the demo."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if not path.is_relative_to(EXEMPT):
            yield path


def name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_no_module_is_over_400_lines() -> None:
    too_long = [
        f"{name(path)}: {lines} lines"
        for path in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(too_long)


def test_no_function_is_over_50_lines() -> None:
    too_long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name(path)}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)


def test_no_class_name_is_defined_twice() -> None:
    defined: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(name(path))
    twice = [f"{cls}: {', '.join(paths)}" for cls, paths in defined.items() if len(paths) > 1]
    assert not twice, "class names defined more than once:\n" + "\n".join(twice)


def test_at_most_ten_modules_sit_directly_in_the_package() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules directly in sidecar/ (at most {MAX_TOP_LEVEL_MODULES}): "
        + ", ".join(top)
    )


# docs/architecture.md's layers, bottom first. A module may import from its own layer and
# those below; ``inject`` and ``demo`` sit beside the stack, above config and serve.
LAYERS = (
    ("outcomes", "ids", "credentials"),
    ("config",),
    ("tool", "transport"),
    ("telemetry",),
    ("repair",),
    ("retry",),
    ("serve",),
    ("inject", "demo"),
    ("cli", "__main__"),
)


def layer_of(module: str) -> int:
    """The layer of ``sidecar.<part>...``."""
    part = module.split(".")[1]
    return next(number for number, parts in enumerate(LAYERS) if part in parts)


def test_imports_point_down_the_layers() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        if relative.parts[1:] in ((), ("__init__",)):
            continue
        here = layer_of(".".join(relative.parts))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sidecar."):
                assert node.module is not None
                if layer_of(node.module) > here:
                    upward.append(f"{name(path)}:{node.lineno} imports {node.module}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)
