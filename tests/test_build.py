"""The two builds: when a wheel is compiled (a table), what a wheel built without a compiler
holds, and how the package tells which build it runs."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from sidecar.build import COMPILED_MODULES, compiled_modules

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_backend"))

import compile_choice  # noqa: E402  (the build backend's, found through the line above)
from compile_choice import CompileSettingError, will_compile  # noqa: E402

ERROR = CompileSettingError

# SIDECAR_COMPILE, editable, a compiler works -> compiled, pure, or an error. A source build
# is pure unless asked: the same command gives the same program with or without gcc.
DECISIONS = [
    (None, False, True, False),
    (None, False, False, False),
    ("", False, True, False),
    ("", False, False, False),
    ("0", False, True, False),
    ("0", False, False, False),
    ("1", False, True, True),
    ("1", False, False, ERROR),
    # An editable install is pure whatever is asked: its extensions would shadow edits.
    (None, True, True, False),
    ("1", True, True, False),
    ("1", True, False, False),
    ("0", True, True, False),
    # Anything but 0 or 1 is refused rather than read as either.
    ("yes", False, True, ERROR),
    ("true", True, True, ERROR),
    (" 1", False, True, ERROR),
]


@pytest.mark.parametrize(("setting", "editable", "compiler", "expected"), DECISIONS)
def test_when_a_build_compiles(
    setting: str | None, editable: bool, compiler: bool, expected: bool | type[Exception]
) -> None:
    probes: list[bool] = []

    def compiler_works() -> bool:
        probes.append(compiler)
        return compiler

    if expected is ERROR:
        with pytest.raises(CompileSettingError, match="SIDECAR_COMPILE"):
            will_compile(setting, editable, compiler_works)
    else:
        assert will_compile(setting, editable, compiler_works) is expected
    # Only a build asked to compile looks for a compiler.
    assert bool(probes) == (setting == "1" and not editable)


def test_a_compiled_build_asks_for_the_type_checker_and_what_it_reads() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = compile_choice.compile_requirements(ROOT / "pyproject.toml")

    mypy = [r for r in requirements if r.startswith("mypy")]
    assert len(mypy) == 1 and mypy[0] in project["optional-dependencies"]["test"]
    assert {"types-PyYAML", "types-jsonschema"} <= set(requirements)
    assert set(project["dependencies"]) <= set(requirements)
    # The check follows imports into the tracing modules: without their packages it failed
    # in every clean build environment.
    assert set(project["optional-dependencies"]["otel"]) <= set(requirements)


def test_every_compiled_module_is_a_module_of_the_package() -> None:
    for name in COMPILED_MODULES:
        assert (ROOT / Path(*name.split("."))).with_suffix(".py").is_file(), name


def test_no_compiled_function_binds_one_name_to_two_kinds_of_exception() -> None:
    """mypyc gives a name one type per function: ``except A as exc`` then ``except B as
    exc`` compiles, then raises TypeError when a B is caught (it did, in exchange.send)."""
    reused = []
    for module in COMPILED_MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            caught: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type:
                    caught.setdefault(node.name, set()).add(ast.unparse(node.type))
            reused += [
                f"{module}.{function.name}: {name}"
                for name, kinds in caught.items()
                if len(kinds) > 1
            ]
    assert reused == []


def test_an_extension_beside_a_module_is_what_counts_as_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "builtpkg"
    package.mkdir()
    for module in ("__init__.py", "plain.py", "fast.py"):
        (package / module).write_text("")
    # Never loaded: the import system picks its loader from the file name alone.
    (package / f"fast{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert compiled_modules(("builtpkg.plain", "builtpkg.fast")) == ("builtpkg.fast",)
    assert compiled_modules(("builtpkg.plain",)) == ()


# What a build reads: the files the image's build stage copies too.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "build_backend", "sidecar")


def _wheel(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``pip wheel`` of a copy of this tree (in ``tmp_path / "src"``, so that nothing is
    written here), in the isolated build environment pip gives a user; the wheel goes to
    ``tmp_path``."""
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.so")
            shutil.copytree(ROOT / name, source / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy(ROOT / name, source / name)
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp_path),
         str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "SIDECAR_COMPILE"}, **env},
    )  # fmt: skip


def _extensions(tmp_path: Path) -> list[str]:
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sidecar/retry/engine.py" in names
    return [name for name in names if name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))]


@pytest.mark.slow
@pytest.mark.parametrize("compiler", [{}, {"CC": "/nonexistent/cc"}], ids=["gcc", "no-compiler"])
def test_a_source_build_is_pure_python_with_or_without_a_compiler(
    tmp_path: Path, compiler: dict[str, str]
) -> None:
    built = _wheel(tmp_path, **compiler)
    assert built.returncode == 0, built.stderr
    assert _extensions(tmp_path) == []


@pytest.mark.slow
def test_a_pure_wheel_holds_no_extension_an_earlier_build_left_behind(tmp_path: Path) -> None:
    # setuptools packs whatever its build directory holds.
    left = tmp_path / "src/build/lib/sidecar/retry"
    left.mkdir(parents=True)
    (left / f"engine{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    built = _wheel(tmp_path, SIDECAR_COMPILE="0")
    assert built.returncode == 0, built.stderr
    assert _extensions(tmp_path) == []


@pytest.mark.slow
def test_sidecar_compile_1_without_a_compiler_fails_the_build(tmp_path: Path) -> None:
    built = _wheel(tmp_path, CC="/nonexistent/cc", SIDECAR_COMPILE="1")
    assert built.returncode != 0
    assert "SIDECAR_COMPILE=1 asks for the compiled build" in built.stdout + built.stderr
    assert not list(tmp_path.glob("*.whl"))
