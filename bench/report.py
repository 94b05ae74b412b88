"""A bench script's report: each line printed as it comes, and kept to be written out."""

from __future__ import annotations

import os
import time
from pathlib import Path


class Report:
    """Call it with a line to print and keep it; ``write`` puts every line in a file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self, path: str | Path) -> None:
        Path(path).write_text("\n".join(self.lines) + "\n")

    def finish(self, started: float, out: str | None) -> None:
        """The run's time since ``started`` (``time.monotonic``) and the load it left; then
        every line into ``out``, when one is named."""
        elapsed_s, load = time.monotonic() - started, os.getloadavg()[0]
        self(f"Run time {elapsed_s:.0f} s; load average after {load:.2f}.")
        if out:
            self.write(out)
