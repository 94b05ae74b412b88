"""docs/architecture.md's "One request's walk" names real code, and the code it names runs.

Every ``module.function`` (and ``module.Class.method``, or ``Class.method`` of a class the
walk already placed in a module) in the section must exist; each function must be entered
while the walk's own request goes through a running sidecar (a profile hook records every
function of the package that starts). Classes it names must exist. The section is parsed
as written, so the walk can be reworded without touching this test.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sidecar"
QUALIFIED = re.compile(r"([a-z_]+(?:/[a-z_]+)+)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?")
CLASS_MEMBER = re.compile(r"([A-Z]\w*)\.([a-z_]\w*)(?:\(\))?")


def walk_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## One request's walk")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def module_file(short: str) -> Path:
    """``serve/proxy`` or ``guards/circuit``: the one module of the package at that path."""
    found = [path for path in PACKAGE.rglob(f"{short}.py") if path.match(f"*/{short}.py")]
    assert len(found) == 1, f"{short} names {len(found)} modules"
    return found[0]


def named_in_walk() -> list[tuple[Path, str]]:
    """(module file, dotted name in it) for every name the walk gives, in order."""
    named: list[tuple[Path, str]] = []
    classes: dict[str, Path] = {}
    for span in re.findall(r"`([^`]+)`", walk_section()):
        if qualified := QUALIFIED.fullmatch(span):
            path = module_file(qualified[1])
            named.append((path, qualified[2]))
            first = qualified[2].split(".")[0]
            if first[0].isupper():
                classes[first] = path
        elif (member := CLASS_MEMBER.fullmatch(span)) and member[1] in classes:
            named.append((classes[member[1]], f"{member[1]}.{member[2]}"))
    return named


def resolve(path: Path, dotted: str) -> Any:
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    value: Any = module
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_every_name_the_walk_gives_exists():
    named = named_in_walk()
    assert len(named) >= 5, named  # the section still names code: the parse found it
    missing = []
    for path, dotted in named:
        try:
            resolve(path, dotted)
        except AttributeError:
            missing.append(f"{path.relative_to(ROOT)}: {dotted}")
    assert not missing, "the walk names what does not exist:\n" + "\n".join(missing)


def flaky_tool() -> Any:
    """Answers 503, then 200, as in the walk."""
    answered = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal answered
        answered += 1
        await request.read()
        if answered == 1:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"temperature": 21})

    return handler


async def test_every_function_the_walk_names_runs_for_its_request(
    make_tool, make_sidecar, tmp_path
):
    tool = await make_tool(flaky_tool())
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"lat": {"type": "number"}}}))
    sidecar = await make_sidecar(
        routes=[
            {"name": "weather", "prefix": "/weather", "upstream": tool.url, "schema": str(schema)}
        ]
    )
    entered: set[tuple[str, str]] = set()
    package = str(PACKAGE)

    def record(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(package):
            entered.add((frame.f_code.co_filename, frame.f_code.co_qualname))

    sys.setprofile(record)
    try:
        async with sidecar.client.post("/weather/current", json={"lat": "35.6"}) as response:
            body = await response.read()
    finally:
        sys.setprofile(None)

    # The walk's request went the walk's way: coerced, 503, then 200.
    assert response.status == 200, body
    assert response.headers["X-Sidecar-Trail"].startswith("503 backoff=")
    assert [json.loads(seen.body) for seen in tool.seen] == [{"lat": 35.6}] * 2
    functions = [
        (path, dotted)
        for path, dotted in named_in_walk()
        if inspect.isfunction(resolve(path, dotted))
    ]
    assert functions
    not_run = [
        f"{path.relative_to(ROOT)}: {dotted}"
        for path, dotted in functions
        if (str(path), dotted) not in entered
    ]
    assert not not_run, "the walk names functions its request never enters:\n" + "\n".join(not_run)
