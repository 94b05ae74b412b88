"""The compiled hot path, when the build backend (build_backend/sidecar_backend.py) says so;
everything else about the package is in pyproject.toml."""

from __future__ import annotations

import atexit
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "build_backend"))

from compile_choice import COMPILE_FLAG  # noqa: E402  (found through the line above)


def hot_path_sources() -> list[str]:
    """The files of ``sidecar.build.COMPILED_MODULES``, the one list of what is compiled
    (read without importing the package, whose dependencies a build does not have)."""
    names = runpy.run_path(str(HERE / "sidecar" / "build.py"))["COMPILED_MODULES"]
    return [str(Path(*name.split("."))) + ".py" for name in names]


def wheel_options(compiled: bool) -> dict[str, Any]:
    """A wheel is built in a scratch directory of its own: setuptools packs whatever its
    build directory holds, so the extensions of an earlier compiled build left in ./build
    would land in a pure wheel."""
    scratch = tempfile.mkdtemp(prefix="sidecar-build-")
    atexit.register(shutil.rmtree, scratch, True)
    options: dict[str, Any] = {"options": {"build": {"build_base": scratch}}}
    if compiled:
        from mypyc.build import mypycify

        options["ext_modules"] = mypycify(hot_path_sources(), target_dir=scratch)
    return options


flag = os.environ.get(COMPILE_FLAG)
setup(**({} if flag is None else wheel_options(compiled=flag == "1")))
