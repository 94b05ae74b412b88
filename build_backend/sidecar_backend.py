"""The package's build backend: setuptools', with the hot path compiled by mypyc when
``SIDECAR_COMPILE=1`` asks (``compile_choice`` says when).

mypy (and what it reads) is asked for only when the wheel will be compiled, so a pure
build installs nothing it does not use. An editable install is always pure Python:
setuptools' own editable hooks run setup.py without ``COMPILE_FLAG``.
"""

from __future__ import annotations

import os
from pathlib import Path

import compile_choice
from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

ConfigSettings = dict[str, str | list[str]] | None


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    requires: list[str] = _setuptools.get_requires_for_build_wheel(config_settings)
    if compile_choice.compile_this_build(editable=False):
        requires += compile_choice.compile_requirements(Path("pyproject.toml"))
    return requires


def build_wheel(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    compiled = compile_choice.compile_this_build(editable=False)
    os.environ[compile_choice.COMPILE_FLAG] = "1" if compiled else "0"
    try:
        name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    finally:
        del os.environ[compile_choice.COMPILE_FLAG]
    return name
