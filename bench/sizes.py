"""How large the package's rooms are: modules by lines, and the longest functions.

    python bench/sizes.py [--tree DIR] [--top N]

A report, not a rule: a module is as long as what belongs together in it (h11's
``_connection.py`` is 659 lines, tenacity's ``__init__.py`` 832). Read it to see where a
room grew without a reason; ``tests/test_architecture.py`` keeps the rules that mean
something (the layers, the machine's purity, the engine's branches, one name per concept).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_lines(package: Path) -> list[tuple[int, str]]:
    """Every module's line count, largest first."""
    sized = [
        (len(path.read_text().splitlines()), str(path.relative_to(package.parent)))
        for path in package.rglob("*.py")
    ]
    return sorted(sized, reverse=True)


def function_lines(package: Path) -> list[tuple[int, str]]:
    """Every function's line count (its docstring included), largest first."""
    sized = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = f"{path.relative_to(package.parent)}:{node.lineno} {node.name}"
                sized.append((node.end_lineno - node.lineno + 1, where))
    return sorted(sized, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="a source tree (default: this)")
    parser.add_argument("--top", type=int, default=15, help="rows of each table")
    arguments = parser.parse_args()
    package = arguments.tree / "sidecar"
    modules = module_lines(package)
    print(f"{len(modules)} modules, {sum(lines for lines, _ in modules)} lines\n")
    print("| module | lines |\n|---|---|")
    for lines, module in modules[: arguments.top]:
        print(f"| `{module}` | {lines} |")
    print("\n| function | lines |\n|---|---|")
    for lines, function in function_lines(package)[: arguments.top]:
        print(f"| `{function}` | {lines} |")


if __name__ == "__main__":
    main()
