"""``andon bench exit``: SIGINT → process exit of a real ``andon run``, beside bare asyncio.

The user-visible stop of a CI job is not the durable ``turn/end`` (``andon bench interrupt``) but
the moment the ``andon`` process is gone and the runner may go on. Each run starts ``andon run
--json`` on the tree scenario (about 50 processes: background jobs that ignore SIGINT, a ``setsid``
escapee, a double-forked daemon), waits for the tool's ``ready`` line, waits a seeded random moment,
sends SIGINT to andon's pid and stops the clock when the process has exited (``waitpid``).
100 ms later it counts what is left of the run (every process carries the run's tag).

The baseline, measured in the same run the same way, is the least a Python program can do: an
asyncio loop that starts the same tree in a process group of its own, and on SIGINT sends SIGINT to
that group, waits for its child and exits. It stops neither the escapee nor the daemon (its
survivors are counted, then killed): it is the floor of interpreter start, signal delivery and
exit, not a competitor. The goal (docs/benchmarks.md, The exit figure): andon's p50 ≤ the
baseline's p50 + 10 ms, with 0 survivors.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from andon import procs
from andon.testing import benchmark_tree

from . import _floors
from ._stats import ms, summary, table

__all__ = ["GOAL_MS", "one_call_run", "run_exit"]

GOAL_MS = 10.0  # andon's p50 may exceed the baseline's by this much
AFTER = 0.1  # survivors are counted this long after the exit
REAP_FOR = 30.0  # the wrapper's wait for the run's orphans (the bench kills any after AFTER)

# The baseline: no andon import, nothing but asyncio, a child in its own group, and SIGINT. (It
# signals its own unreaped child's group, so the bare number is safe there.)
_BASELINE = """
import asyncio, signal, subprocess, sys
from os import killpg

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    child = subprocess.Popen(["bash", "-c", sys.argv[1]], stdout=subprocess.PIPE,
                             start_new_session=True)
    line = await asyncio.to_thread(child.stdout.readline)
    sys.stdout.buffer.write(line)
    sys.stdout.flush()
    await stop.wait()
    killpg(child.pid, signal.SIGINT)
    await asyncio.to_thread(child.wait)
    return 130

sys.exit(asyncio.run(main()))
"""


@dataclass
class Side:
    """One program's runs: exit latencies, exit codes, what each left."""

    name: str
    latencies: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    # andon only: SIGINT -> its turn/end line on stdout (durable by then), the rest is leaving
    to_turn_end: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the whole run: start, tree, stop, exit

    def to_json(self) -> dict[str, Any]:
        data = {
            "latency": summary(self.latencies),
            "exit_codes": sorted(set(self.codes)),
            "survivors_max": max(self.survivors),
            "cpu": summary(self.cpu),
        }
        if self.to_turn_end:
            data["to_turn_end"] = summary(self.to_turn_end)
        return data


def run_exit(
    runs: int, grace: str, seed: int, progress: Callable[[str, int, int], None]
) -> tuple[dict[str, Any], str, bool]:
    """Alternate andon and baseline runs (so that load drifts hit both alike); returns the JSON
    data, the table and whether andon failed (left a process, or exited other than 130)."""
    rng = random.Random(seed)
    andon_side, bare_side = Side("andon run"), Side("bare asyncio")
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"andon-bench-exit-{secrets.token_hex(4)}"
    root.mkdir(mode=0o700)
    try:
        for i in range(runs):
            progress("exit", i, runs)
            _one(andon_side, _andon_argv(root, i, grace), root, rng, env_extra=_home(root))
            _one(bare_side, _baseline_argv(root, i), root, rng)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return _report(andon_side, bare_side, runs, grace, seed)


def _home(root: Path) -> dict[str, str]:
    return {"ANDON_HOME": str(root / "home")}


def one_call_run(script: Path, command: str, *flags: str) -> list[str]:
    """The argv of an ``andon run`` whose scripted model (written to ``script``) makes one bash
    call of ``command``, then answers: the job ``exit`` stops and ``startup`` times."""
    reply = {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}
    script.write_text(json.dumps({"replies": [reply, {"text": "done"}]}))
    andon = str(Path(sys.executable).parent / "andon")
    return [andon, "run", *flags, "--model", f"script:{script}", "go"]


def _andon_argv(root: Path, i: int, grace: str) -> list[str]:
    command = benchmark_tree(str(root / f"ticks-{i}"))
    return one_call_run(root / f"model-{i}.json", command, "--json", "--grace", grace)


def _baseline_argv(root: Path, i: int) -> list[str]:
    return [sys.executable, "-c", _BASELINE, benchmark_tree(str(root / f"bare-ticks-{i}"))]


def _one(
    side: Side,
    argv: list[str],
    root: Path,
    rng: random.Random,
    env_extra: dict[str, str] | None = None,
) -> None:
    tag = secrets.token_hex(8)
    entry = f"{_floors.TAG_VAR}={tag}".encode()
    env = {**os.environ, **(env_extra or {})}
    env.pop(_floors.TAG_VAR, None)
    # Both programs run under the same child subreaper (_floors.SUBREAPER): it passes the SIGINT
    # on, says on stderr when the program exited, and reaps the whole run to say its CPU time.
    proc = subprocess.Popen(
        _floors.subreaper_argv(REAP_FOR, entry, argv),
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # nothing of ours shares its group; the runner's view of a step
        preexec_fn=_floors.default_signals,
    )
    drain: threading.Thread | None = None
    try:
        assert proc.stdout is not None and proc.stderr is not None
        _until_ready(proc.stdout)
        turn_end: list[float] = []
        drain = threading.Thread(target=_drain, args=(proc.stdout, turn_end), daemon=True)
        drain.start()
        time.sleep(rng.uniform(0.0, 0.05))  # a seeded random moment of the tool's run
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the wrapper passes it on, for both programs alike
        exited = _said(proc.stderr, "exited")  # blocks until the program has exited
        side.latencies.append(exited["exited"] - t)
        if turn_end:
            side.to_turn_end.append(turn_end[0] - t)
        side.codes.append(exited["code"])
        time.sleep(AFTER)
        side.survivors.append(len(procs.tagged(entry, exclude=(os.getpid(),))))
        _floors.kill_tagged(entry)  # what the baseline left, so that the wrapper can finish
        side.cpu.append(_said(proc.stderr, "cpu")["cpu"])
        if not _floors.wait_exit(proc, 30):
            raise RuntimeError("the wrapper did not exit once the run's processes were gone")
    finally:
        if proc.poll() is None:
            procs.killpg_pinned(proc.pid, signal.SIGKILL)  # our unreaped child leads it
            proc.wait()
        _floors.kill_tagged(entry)  # the baseline's survivors hold the pipe open until now
        if drain is not None:
            drain.join(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _said(stderr: IO[bytes], key: str) -> dict[str, Any]:
    """The wrapper's next line on stderr, which must hold ``key``."""
    line = stderr.readline()
    said: dict[str, Any] = json.loads(line) if line.strip() else {}
    if key not in said:
        raise RuntimeError(f"the benchmark's wrapper ended without saying {key!r}")
    return said


def _drain(stdout: IO[bytes], turn_end: list[float]) -> None:
    """Read the rest of stdout (never let the program block on it), noting when andon's
    ``turn/end`` line arrives (it is printed once the record is durable)."""
    for line in stdout:
        if not turn_end and b'"turn/end"' in line:
            turn_end.append(time.monotonic())


def _until_ready(stdout: IO[bytes]) -> None:
    """Read lines until the tool has printed ``ready``: andon's ``tool/output`` event that carries
    it, or the baseline's own line. (The word alone is not enough: andon's ``tool/call`` and
    ``assistant/chunk`` lines hold the command, ``echo ready`` included, before the tool runs.)"""
    for line in stdout:
        if line.strip() == b"ready":
            return  # the baseline passes its tool's line through as it is
        if b'"tool/output"' in line and "ready" in str(json.loads(line).get("text", "")):
            return
    raise RuntimeError("the program ended before its tool was ready")


def _report(
    andon_side: Side, bare_side: Side, runs: int, grace: str, seed: int
) -> tuple[dict[str, Any], str, bool]:
    a, b = andon_side.to_json(), bare_side.to_json()
    over = a["latency"]["p50"] - b["latency"]["p50"]
    met = over * 1000 <= GOAL_MS
    # A speed figure is reported, never a failure (a loaded machine is slow); what andon left,
    # or a wrong exit code, is.
    bad = a["survivors_max"] > 0 or a["exit_codes"] != [130]
    data = {
        "runs": runs,
        "grace": grace,
        "seed": seed,
        "andon": a,
        "baseline": b,
        "overhead_p50": over,
        "goal_ms": GOAL_MS,
        "goal_met": met,
    }
    rows = [
        [
            s.name,
            ms(j["latency"]["p50"]),
            ms(j["latency"]["p95"]),
            ms(j["latency"]["max"]),
            ",".join(str(c) for c in j["exit_codes"]),
            j["survivors_max"],
            ms(j["cpu"]["p50"]),
        ]
        for s, j in ((andon_side, a), (bare_side, b))
    ]
    headers = ["SIGINT → exit (ms)", "p50", "p95", "max", "exit", "survivors", "run CPU p50"]
    verdict = "met" if met else "MISSED"
    split = ""
    if "to_turn_end" in a:
        end = a["to_turn_end"]["p50"]
        split = (
            f"; of andon's p50, {end * 1000:.2f} ms to its turn/end line and "
            f"{(a['latency']['p50'] - end) * 1000:.2f} ms from there to its exit"
        )
    text = table(headers, rows) + (
        f"\n\nandon p50 - baseline p50 = {over * 1000:.2f} ms "
        f"(goal ≤ {GOAL_MS:.0f} ms: {verdict}); "
        "the baseline stops neither the escapee nor the daemon" + split + "; run CPU: every "
        "process of the run, from its start to its end (the baseline's survivors until the "
        "bench kills them, 100 ms after its exit)"
    )
    return data, text, bad
