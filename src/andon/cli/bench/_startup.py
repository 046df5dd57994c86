"""``andon bench startup``: exec → first tool process, and the CPU of a trivial one-call job.

Each run starts ``andon run`` on a scripted model whose only step is one tool call, ``printf x``
into a FIFO the benchmark reads: the moment that byte arrives is the first tool process, running.
The run then ends (the model's second reply) and the clock stops at the process's exit.

CPU time is what the run cost the machine in all: andon, the forkserver, the workers, the tool. A
small wrapper process starts ``andon``, is a child subreaper (so the workers, children of a
forkserver andon kills at exit, are reparented to it rather than to init) and reaps every
descendant before it reads its ``RUSAGE_CHILDREN``. Its own start is not counted, and it takes the
start time on the same clock the benchmark reads (``CLOCK_MONOTONIC``).

Every interpreter measured reads andon's modules from bytecode, as an installed andon's do (pip
compiles them when it installs): :func:`ensure_bytecode` compiles what is missing first. Without
it, a checkout run with ``PYTHONDONTWRITEBYTECODE`` set compiles every module of andon's from
source in every process, each time (about 100 ms of CPU per interpreter on the development
machine), and the figures would measure the compiler.

The floors, measured the same way in the same run, alternating with andon's runs so that load
drifts hit both alike: an interpreter that does nothing, one that imports ``andon.cli`` (what the
command must import before it can parse), and one that imports ``andon.workers`` (what the
forkserver preloads before it can fork the first worker). The goals (docs/benchmarks.md, Start-up):
CPU of the job ≤ 0.5 s, and exec → first tool ≤ 3 × (the ``andon.cli`` floor + the
``andon.workers`` floor).
"""

from __future__ import annotations

import compileall
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _floors
from ._exit import one_call_run
from ._stats import ms, summary, table

__all__ = ["CPU_GOAL", "FIRST_TOOL_FACTOR", "ensure_bytecode", "run_startup"]

CPU_GOAL = 0.5  # seconds of CPU for the whole trivial job
FIRST_TOOL_FACTOR = 3.0  # exec -> first tool, against import andon.cli + import andon.workers
_REAP_FOR = 10.0  # seconds the wrapper waits for the run's orphans to end


@dataclass
class Side:
    """One program's runs: wall times, CPU times, exit codes."""

    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    first_tool: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "wall": summary(self.wall),
            "cpu": summary(self.cpu),
            "exit_codes": sorted(set(self.codes)),
        }
        if self.first_tool:
            data["first_tool"] = summary(self.first_tool)
        return data


def run_startup(
    runs: int, progress: Callable[[str, int, int], None]
) -> tuple[dict[str, Any], str, bool]:
    """Alternate andon's runs with the floors'; returns the JSON data, the table and whether
    andon failed (an exit other than 0, or no tool process seen)."""
    andon = Side("andon run, one call")
    floors = [
        Side("python -c pass"),
        Side("import andon.cli"),
        Side("import andon.workers"),
    ]
    codes = ["pass", "import andon.cli", "import andon.workers"]
    bytecode = ensure_bytecode()
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"andon-bench-startup-{secrets.token_hex(4)}"
    root.mkdir(mode=0o700)
    try:
        for i in range(runs):
            progress("startup", i, runs)
            _andon_run(andon, root, i)
            for side, code in zip(floors, codes, strict=True):
                _wrapped(side, [sys.executable, "-c", code], root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    data, text, bad = _report(andon, floors, runs)
    data["bytecode"] = bytecode
    return data, f"{text}\nandon's bytecode: {bytecode}", bad


def ensure_bytecode() -> str:
    """Compile andon's modules that have no current bytecode yet (into their ``__pycache__``);
    say what was done. A package folder that cannot be written is said, not an error: the
    figures then include compiling andon's sources."""
    import andon

    package = Path(andon.__file__).parent
    try:
        fine = compileall.compile_dir(package, quiet=2, workers=1)
    except OSError as e:
        return f"not cached ({e.strerror}); figures include compiling andon from source"
    return "cached" if fine else "partly cached; figures include compiling some of andon"


def _wrapped(
    side: Side, argv: list[str], root: Path, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``argv`` under the wrapper; record its wall and CPU time; return what it said."""
    entry = f"{_floors.TAG_VAR}={secrets.token_hex(8)}".encode()
    env = {**os.environ, **(env_extra or {})}
    env.pop(_floors.TAG_VAR, None)
    try:
        lines = subprocess.run(
            _floors.subreaper_argv(_REAP_FOR, entry, argv),
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
            check=True,
        ).stderr.splitlines()
    finally:
        _floors.kill_tagged(entry)  # nothing outlives a run
    said: dict[str, Any] = {**json.loads(lines[0]), **json.loads(lines[1])}
    side.wall.append(said["exited"] - said["t0"])
    side.cpu.append(said["cpu"])
    side.codes.append(said["code"])
    return said


def _andon_run(side: Side, root: Path, i: int) -> None:
    fifo = root / f"tool-{i}"
    os.mkfifo(fifo, 0o600)
    argv = one_call_run(root / f"model-{i}.json", f"printf x > {fifo}")
    seen: list[float] = []

    def first_byte() -> None:
        with open(fifo, "rb") as reader:  # blocks until the tool (or the unblocking below) opens
            if reader.read(1):
                seen.append(time.monotonic())

    reader = threading.Thread(target=first_byte, daemon=True)
    reader.start()
    try:
        said = _wrapped(side, argv, root, {"ANDON_HOME": str(root / "home")})
    finally:
        if reader.is_alive():  # no tool ran: open the writing end ourselves, so the read ends
            with open(fifo, "wb"):
                pass
        reader.join(timeout=10)
    if seen:
        side.first_tool.append(seen[0] - said["t0"])


def _report(andon: Side, floors: list[Side], runs: int) -> tuple[dict[str, Any], str, bool]:
    a = andon.to_json()
    f = {side.name: side.to_json() for side in floors}
    floor = f["import andon.cli"]["wall"]["p50"] + f["import andon.workers"]["wall"]["p50"]
    first = a.get("first_tool", {}).get("p50")
    cpu_met = a["cpu"]["p50"] <= CPU_GOAL
    first_met = first is not None and first <= FIRST_TOOL_FACTOR * floor
    bad = a["exit_codes"] != [0] or len(andon.first_tool) != runs
    data = {
        "runs": runs,
        "andon": a,
        "floors": f,
        "first_tool_floor": floor,
        "cpu_goal": CPU_GOAL,
        "cpu_goal_met": cpu_met,
        "first_tool_factor": FIRST_TOOL_FACTOR,
        "first_tool_goal_met": first_met,
    }
    rows: list[list[object]] = [
        [
            andon.name,
            ms(first),
            ms(a["wall"]["p50"]),
            ms(a["wall"]["p95"]),
            ms(a["cpu"]["p50"]),
            ",".join(str(c) for c in a["exit_codes"]),
        ]
    ]
    rows += [
        [
            name,
            "—",
            ms(j["wall"]["p50"]),
            ms(j["wall"]["p95"]),
            ms(j["cpu"]["p50"]),
            ",".join(str(c) for c in j["exit_codes"]),
        ]
        for name, j in f.items()
    ]
    headers = ["start-up (ms)", "first tool p50", "exit p50", "exit p95", "CPU p50", "exit"]
    text = table(headers, rows) + (
        f"\n\nCPU of the one-call job, p50: {a['cpu']['p50'] * 1000:.0f} ms "
        f"(goal ≤ {CPU_GOAL * 1000:.0f} ms: {'met' if cpu_met else 'MISSED'}); "
        f"exec → first tool, p50: {ms(first)} ms (goal ≤ {FIRST_TOOL_FACTOR:g} × "
        f"{floor * 1000:.1f} ms = {FIRST_TOOL_FACTOR * floor * 1000:.1f} ms: "
        f"{'met' if first_met else 'MISSED'}); CPU counts every process the run started"
    )
    return data, text, bad
