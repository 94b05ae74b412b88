"""The package's shape: few modules at its top, one name per concept, and imports that
point down the layers of docs/architecture.md; the retry machine pure, the engine a thin
loop.

How long a module or a function is, is reported (``python bench/sizes.py``), not capped:
a room is sized by what belongs together, and a ruler that cut rooms opened an import
circle in 0.5. Each failure names every offender, so one run shows all that is left.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sidecar"
MAX_TOP_LEVEL_MODULES = 10


def modules() -> Iterator[Path]:
    """Every module of the package."""
    yield from sorted(PACKAGE.rglob("*.py"))


def name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


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
    ("outcomes", "bugs", "ids", "credentials", "build"),
    ("config",),
    ("wire",),
    ("tool", "transport"),
    ("telemetry",),
    ("repair",),
    ("retry",),
    ("serve",),
    ("inject", "demo"),
    ("cli", "__main__"),
)


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


# Where the layer map's right column, what each floor does, begins.
MAP_DESCRIPTION_COLUMN = 52


def layer_map() -> dict[str, set[str]]:
    """The module names on each floor of docs/architecture.md's layer map (its left
    column), by the folder that begins the floor's line; ``ground`` for the modules
    directly in the package, with the command line's."""
    block = ARCHITECTURE.read_text().split("## The layers", 1)[1].split("```", 2)[1]
    names: dict[str, set[str]] = {"ground": set()}
    folder = "ground"
    for line in block.splitlines():
        listed = line[:MAP_DESCRIPTION_COLUMN]
        if listed.startswith("  ") and not listed.startswith("   "):  # a floor's first line
            folder = listed.split()[0].rstrip("/")
        names.setdefault(folder, set()).update(re.findall(r"[\w.]+", listed))
    return names


def test_the_layer_map_names_every_module() -> None:
    names = layer_map()
    missing = []
    for path in modules():
        if path.name == "__init__.py":
            continue
        parts = path.relative_to(PACKAGE).parts
        folder = parts[0] if len(parts) > 1 else "ground"
        if path.stem not in names.get(folder, set()) and path.name not in names["ground"]:
            missing.append(name(path))
    assert not missing, "docs/architecture.md's layer map leaves out: " + ", ".join(missing)


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


# The retry loop only carries out what the retry machine decides: nearly branchless, so a
# rule added to it shows here rather than hiding in the loop.
ENGINE = PACKAGE / "retry" / "engine.py"
MAX_ENGINE_BRANCHES = 12


def test_the_retry_engine_stays_a_thin_loop() -> None:
    source = ENGINE.read_text()
    branches = [
        node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.If | ast.While)
    ]
    assert len(branches) <= MAX_ENGINE_BRANCHES, (
        f"{name(ENGINE)}: {len(branches)} if/elif/while lines (at most {MAX_ENGINE_BRANCHES}): "
        + ", ".join(map(str, branches))
    )


# The retry machine is pure: what it imports, however indirectly, does no I/O of its own.
PURE_MODULES = ("sidecar.retry.machine", "sidecar.retry.steps")
IMPURE = ("asyncio", "aiohttp", "sidecar.transport", "sidecar.telemetry", "sidecar.config.loader")


def imported_by(module: str) -> set[str]:
    """Every module ``module`` imports, directly or through the package's own modules."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        path = PACKAGE.parent / (current.replace(".", "/") + ".py")
        if not path.exists():
            path = path.with_suffix("") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for imported in names:
                if imported not in seen:
                    seen.add(imported)
                    if imported.startswith("sidecar."):
                        todo.append(imported)
    return seen


def test_the_retry_machine_imports_no_io() -> None:
    impure = {
        f"{module} -> {imported}"
        for module in PURE_MODULES
        for imported in imported_by(module)
        if imported.startswith(IMPURE)
    }
    assert not impure, "the retry machine reaches I/O:\n" + "\n".join(sorted(impure))


def test_importing_the_retry_machine_loads_no_io() -> None:
    """The same, as Python sees it: a fresh interpreter that imports the machine."""
    probe = (
        "import sys, sidecar.retry.machine\n"
        f"print('\\n'.join(m for m in sys.modules if m.startswith({IMPURE!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not loaded, "importing the retry machine loads: " + ", ".join(loaded)


def test_only_the_retry_machine_asks_decide() -> None:
    """Every decision after an attempt goes through the machine, which owns what follows."""
    askers = [
        name(path)
        for path in modules()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.module == "sidecar.retry.decide"
    ]
    assert askers == ["sidecar/retry/machine.py"], askers
