"""Whether a build compiles the hot path with mypyc: ``SIDECAR_COMPILE`` and the C compiler.

Read by the build backend (whether to ask for mypy) and by setup.py (whether to compile),
so both reach the same answer from the same inputs. Standard library and setuptools only:
this runs in pip's isolated build environment before anything else is installed.
"""

from __future__ import annotations

import os
import sysconfig
import tempfile
import tomllib
from pathlib import Path

# Imported before any ``distutils``: it puts its own distutils in place, on every Python.
import setuptools  # noqa: F401

SETTING = "SIDECAR_COMPILE"
# How the backend's ``build_wheel`` tells setup.py its answer ("1" or "0"). Every other
# hook runs setup.py without it, pure: asking for requirements runs setup.py before mypy
# is installed, and an editable build is always pure.
COMPILE_FLAG = "_SIDECAR_MYPYC"
# A module that needs Python.h: a compiler without the interpreter's headers cannot build
# an extension, so it counts as none.
_PROBE_SOURCE = "#include <Python.h>\nint sidecar_probe(void) { return Py_IsInitialized(); }\n"


class CompileSettingError(ValueError):
    """``SIDECAR_COMPILE`` holds something other than 0 or 1, or asks for a compiled build
    where no C compiler works."""


def will_compile(setting: str | None, editable: bool, compiler_works: bool) -> bool:
    """Compile when a compiler works, unless the build is editable (a stale extension
    beside an edited ``.py`` would shadow the edit) or ``SIDECAR_COMPILE=0``;
    ``SIDECAR_COMPILE=1`` makes a missing compiler an error instead of a pure build."""
    if setting not in (None, "", "0", "1"):
        raise CompileSettingError(f"{SETTING} must be 0 or 1, not {setting!r}")
    if editable or setting == "0":
        return False
    if setting == "1" and not compiler_works:
        raise CompileSettingError(
            f"{SETTING}=1 asks for the compiled build, but no working C compiler with "
            "Python's headers was found (install gcc, or set CC)"
        )
    return compiler_works


def compile_requirements(pyproject: Path) -> list[str]:
    """What a compiled build installs: the mypy and the stub packages the package is type-
    checked with (the ``test`` extra's), and the package's own dependencies, whose types
    mypyc reads. Without them the build would check against a different picture of the
    code than CI, or fail where they are not installed yet (pip builds a wheel before it
    installs the wheel's dependencies)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    checker = [
        requirement
        for requirement in project["optional-dependencies"]["test"]
        if requirement.startswith(("mypy>", "mypy=", "types-"))
    ]
    return [*checker, *project["dependencies"]]


def c_compiler_works() -> bool:
    """Whether the C compiler setuptools would use (``CC`` or the interpreter's own)
    compiles a file that includes Python.h."""
    from distutils.ccompiler import new_compiler
    from distutils.errors import CCompilerError, DistutilsError
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory(prefix="sidecar-cc-") as scratch:
        source = Path(scratch, "probe.c")
        source.write_text(_PROBE_SOURCE)
        try:
            compiler.compile(
                [str(source)], output_dir=scratch, include_dirs=[sysconfig.get_paths()["include"]]
            )
        except (CCompilerError, DistutilsError, OSError):
            return False
    return True


def compile_this_build(editable: bool) -> bool:
    """``will_compile`` for this process's environment."""
    return will_compile(os.environ.get(SETTING), editable, compiler_works=c_compiler_works())
