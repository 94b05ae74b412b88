"""This tree's compiled build as a directory a bench can run: the wheel pip builds with
``SIDECAR_COMPILE=1`` (a missing compiler fails, never a silent pure build), unpacked.

    python bench/compiled_tree.py OUT      # then: python bench/instructions.py --tree OUT

``processes.tree_serve(OUT, ...)`` serves from it ahead of the editable install. Building
takes a few minutes (mypyc, then the C compiler).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sidecar.build import COMPILED_MODULES

ROOT = Path(__file__).resolve().parent.parent


def compiled_tree(out: Path) -> Path:
    """``out`` holding the compiled wheel's files; checked to import compiled."""
    with tempfile.TemporaryDirectory(prefix="sidecar-wheel-") as wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
             wheels, str(ROOT)],
            env={**os.environ, "SIDECAR_COMPILE": "1"},
            check=True,
        )  # fmt: skip
        (wheel,) = Path(wheels).glob("*.whl")
        zipfile.ZipFile(wheel).extractall(out)
    report = subprocess.run(
        [sys.executable, "-c",
         f"import sys; sys.path.insert(0, {str(out)!r}); from sidecar import build;"
         "print(len(build.compiled_modules()))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    if int(report.stdout) != len(COMPILED_MODULES):
        raise RuntimeError(f"{out}: {report.stdout.strip()} of {len(COMPILED_MODULES)} compiled")
    return out


if __name__ == "__main__":
    print(compiled_tree(Path(sys.argv[1]).resolve()))
