"""Whether a build compiles the hot path with mypyc: only when ``SIDECAR_COMPILE=1`` asks.

A source build is pure Python unless asked, as mypy's (``MYPY_USE_MYPYC=1``) and black's
are: the same ``pip install .`` gives the same program on every machine, installs in
seconds, and cannot fail for want of an optional speed-up. The image and the compiled
wheel are built with ``SIDECAR_COMPILE=1``, where a missing compiler or a failed type
check fails the build loudly instead of shipping pure Python unseen
(docs/performance.md, "The compiled build").

Read by the build backend (whether to ask for mypy) and by setup.py (whether to compile),
so both reach the same answer from the same inputs. Standard library and setuptools only:
this runs in pip's isolated build environment before anything else is installed.
"""

from __future__ import annotations

import os
import sysconfig
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

# Imported before any ``distutils``: it puts its own distutils in place, on every Python.
import setuptools  # noqa: F401

SETTING = "SIDECAR_COMPILE"
# How the backend's ``build_wheel`` tells setup.py its answer ("1" or "0"). Every other
# hook runs setup.py without it, pure: asking for requirements runs setup.py before mypy
# is installed, and an editable build is always pure.
COMPILE_FLAG = "_SIDECAR_MYPYC"
# The optional extras whose packages the package imports (behind a setting): the compiled
# build's type check follows imports into the modules that use them, so it reads them too.
TYPED_EXTRAS = ("otel",)
# A module that needs Python.h: a compiler without the interpreter's headers cannot build
# an extension, so it counts as none.
_PROBE_SOURCE = "#include <Python.h>\nint sidecar_probe(void) { return Py_IsInitialized(); }\n"


class CompileSettingError(ValueError):
    """``SIDECAR_COMPILE`` holds something other than 0 or 1, or asks for a compiled build
    where no C compiler works."""


def will_compile(setting: str | None, editable: bool, compiler_works: Callable[[], bool]) -> bool:
    """Compile only when ``SIDECAR_COMPILE=1`` asks and the build is not editable (a stale
    extension beside an edited ``.py`` would shadow the edit); asked where no compiler
    works, the build fails. ``compiler_works`` is called only then: a pure build probes
    nothing."""
    if setting not in (None, "", "0", "1"):
        raise CompileSettingError(f"{SETTING} must be 0 or 1, not {setting!r}")
    if setting != "1" or editable:
        return False
    if not compiler_works():
        raise CompileSettingError(
            f"{SETTING}=1 asks for the compiled build, but no working C compiler with "
            "Python's headers was found (install gcc, or set CC)"
        )
    return True


def compile_requirements(pyproject: Path) -> list[str]:
    """What a compiled build installs: the mypy and the stub packages the package is type-
    checked with (the ``test`` extra's), the package's own dependencies, whose types mypyc
    reads, and the packages of the extras it imports. pip's build environment holds these
    and nothing else, so the check sees the same packages wherever it runs: on a developer's
    machine, in CI and in ``docker build`` alike."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    checker = [
        requirement
        for requirement in extras["test"]
        if requirement.startswith(("mypy>", "mypy=", "types-"))
    ]
    imported = [requirement for extra in TYPED_EXTRAS for requirement in extras[extra]]
    return [*checker, *project["dependencies"], *imported]


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
    return will_compile(os.environ.get(SETTING), editable, compiler_works=c_compiler_works)
