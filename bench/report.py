"""A bench script's report: each line printed as it comes, and kept to be written out."""

from __future__ import annotations

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
