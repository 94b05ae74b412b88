"""The compiled hot path, when the build backend (build_backend/sidecar_backend.py) says so;
everything else about the package is in pyproject.toml."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "build_backend"))

from compile_choice import COMPILE_FLAG  # noqa: E402  (found through the line above)


def hot_path_sources() -> list[str]:
    """The files of ``sidecar.build.COMPILED_MODULES``, the one list of what is compiled
    (read without importing the package, whose dependencies a build does not have)."""
    names = runpy.run_path(str(HERE / "sidecar" / "build.py"))["COMPILED_MODULES"]
    return [str(Path(*name.split("."))) + ".py" for name in names]


if os.environ.get(COMPILE_FLAG) == "1":
    from mypyc.build import mypycify

    setup(ext_modules=mypycify(hot_path_sources()))
else:
    setup()
