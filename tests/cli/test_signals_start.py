"""A signal during the worker pool's start stops it at once (docs/ci.md, Timeouts and
cancellation): the start is cancelled, what had started is taken down, and the stop meets the
same bound as a stop during a run.

The pool's start is made slow on purpose: every worker connects and never says hello
(``tests/cli/slow_start.py``), so the start lasts until it is stopped. SIGINT, SIGTERM and SIGHUP
land at seeded moments, from the command's start (interpreter, settings, log, forkserver) and from
the moment the first worker exists, to the pid or to the whole group.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from andon import procs
from tests.cli.support import (
    ANDON,
    LONG,
    SLOW_START,
    env,
    run,
    script,
    signal_and_wait,
    start_held,
    start_slow,
)
from tests.support import alive_after

SEED = 20261207
GRACE = (1.0, 1.0)
BOUND = sum(GRACE) + 1.0  # a stop during the run is done within grace + 1 s; so is this one
WAIT = 60.0  # for the process to show a worker, or to exit at all: far above any bound


@dataclass(frozen=True)
class Case:
    name: str
    signum: int
    delay: float
    after_worker: bool  # the delay runs from the moment a worker exists (else from the start)
    group: bool


def _cases() -> list[Case]:
    rng = random.Random(SEED)
    cases = []
    for n in range(20):
        signum = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)[n % 3]
        after = n % 2 == 1
        delay = rng.uniform(0.0, 1.0) if after else rng.uniform(0.2, 2.5)
        cases.append(Case(f"start-{n}", signum, delay, after, group=n % 4 >= 2))
    return cases


@dataclass
class Ran:
    case: Case
    status: int
    took: float  # from the signal to the exit
    stdout: str
    stderr: str
    session: Path
    left: list[procs.ProcInfo]


def _one(case: Case, root: Path) -> Ran:
    folder = root / case.name
    folder.mkdir()
    model = script(
        folder / "m.json",
        [{"tool_calls": [{"name": "bash", "arguments": {"command": LONG}}]}, {"text": "ok"}],
    )
    session = folder / "s"
    name, value = "ANDON_SIGNAL_CASE", secrets.token_hex(8)
    tag = f"{name}={value}".encode()
    grace = ",".join(f"{g:g}" for g in GRACE)
    args = ["run", "--json", "--grace", grace, "--session", str(session), "--model", model]
    proc = subprocess.Popen(
        [sys.executable, SLOW_START, *args, "go"],
        cwd=folder,
        env=env(**{name: value}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        if case.after_worker:
            _wait_for_worker(proc, tag)
        # A seeded moment of the start, not an ordering of a race: landing anywhere in it is
        # the point.
        time.sleep(case.delay)  # sleep-ok: the signal's moment is the thing under test
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)  # our own unreaped child leads the group
        proc.wait()
        raise
    out, err, took = signal_and_wait(proc, case.signum, WAIT, group=case.group)
    left = alive_after(procs.tagged(tag, exclude=(os.getpid(),)), timeout=5.0)
    return Ran(case, proc.returncode, took, out, err, session, left)


def _wait_for_worker(proc: subprocess.Popen[str], tag: bytes) -> None:
    """Until a worker of this andon exists: a process of its tag that is not andon's own child
    (that is the forkserver; a worker is the forkserver's child).
    Polled, with a deadline."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.ppid not in (proc.pid, 0) and p.pid != proc.pid for p in procs.tagged(tag)):
            return
        time.sleep(0.02)  # sleep-ok: polling the process table for a worker, with a deadline
    raise AssertionError("no worker appeared")


def _before_andon(r: Ran) -> bool:
    """The signal ended the process inside the interpreter's own start-up, before andon's first
    line (docs/ci.md, Timeouts and cancellation): by its default action, or CPython's fatal
    start-up error for SIGINT."""
    if r.status == -r.case.signum:
        return True
    return r.case.signum == signal.SIGINT and r.status == 1 and "Fatal Python error" in r.stderr


@pytest.mark.timeout(600)
def test_a_signal_during_the_pool_start_stops_it_at_once(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: _one(c, tmp_path), _cases()))
    problems: list[str] = []
    for r in results:
        c = r.case
        where = f"{c.name} ({signal.Signals(c.signum).name} {c.delay:.3f}s after "
        where += f"{'a worker existed' if c.after_worker else 'the start'}"
        where += f"{', group' if c.group else ''})"
        if not r.session.exists() and _before_andon(r):
            continue
        if r.status != 128 + c.signum:
            problems.append(f"{where}: exit {r.status}, not {128 + c.signum}: {r.stderr[-800:]}")
        if r.took > BOUND:
            problems.append(f"{where}: took {r.took:.2f}s after the signal (bound {BOUND:g}s)")
        if "Traceback" in r.stderr:
            problems.append(f"{where}: traceback:\n{r.stderr[-2000:]}")
        if r.left:
            problems.append(f"{where}: left pids {[p.pid for p in r.left]}")
        summaries = [json.loads(line) for line in r.stdout.splitlines() if '"run/summary"' in line]
        if not summaries or summaries[-1]["exit_code"] != r.status:
            problems.append(f"{where}: exit {r.status}, run/summary {summaries}")
        if r.session.exists():
            check = run("check", str(r.session), cwd=tmp_path)
            if check.returncode != 0:
                problems.append(f"{where}: check: {check.stdout}{check.stderr}")
    assert not problems, "\n".join(problems)


def _pending(pid: int) -> int:
    """The signals pending for the whole process ``pid`` (``ShdPnd``, a bit mask)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("ShdPnd:"):
                return int(line.split()[1], 16)
    return 0


def _deliver(pid: int, signum: int) -> None:
    """Send ``signum`` and wait until it is delivered (no longer pending), with a deadline: only
    then is the order of two signals the order they were sent in."""
    os.kill(pid, signum)
    deadline = time.monotonic() + 5.0
    while _pending(pid) & (1 << (signum - 1)) and time.monotonic() < deadline:
        time.sleep(0.01)  # sleep-ok: polling /proc for the signal's delivery, with a deadline


def _held(tmp_path: Path, tag: str) -> tuple[subprocess.Popen[str], Path]:
    """``andon run --json`` held inside the forkserver's spawn window (slow_start.py)."""
    model = script(tmp_path / "m.json", [{"text": "ok"}])
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    args = ["run", "--json", "--grace", "1,1", "--session", str(tmp_path / "s"), "--model", model]
    environ = env(ANDON_SIGNAL_CASE=tag, HOLD_SPAWN=str(fifo))
    return start_slow(tmp_path, [*args, "go"], environ, until="spawn window held"), fifo


def _release(proc: subprocess.Popen[str], fifo: Path) -> tuple[str, str]:
    with open(fifo, "wb"):
        pass  # lets the window close
    try:
        return proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_first_of_two_signals_in_the_spawn_window_decides(tmp_path: Path) -> None:
    """SIGINT, then SIGTERM, while the forkserver is being spawned: the first decides the exit
    code (tests/fleet/test_forkserver_signals.py shows the mechanism on its own)."""
    tag = secrets.token_hex(8)
    proc, fifo = _held(tmp_path, tag)
    try:
        _deliver(proc.pid, signal.SIGINT)
        _deliver(proc.pid, signal.SIGTERM)
    finally:
        out, err = _release(proc, fifo)
    assert proc.returncode == 128 + signal.SIGINT, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["type"] == "run/summary" and summary["exit_code"] == 130
    assert "Traceback" not in err
    entry = f"ANDON_SIGNAL_CASE={tag}".encode()
    assert not alive_after(procs.tagged(entry, exclude=(os.getpid(),)), timeout=5.0)


def test_the_hard_exit_names_the_signals_and_prints_the_summary(tmp_path: Path) -> None:
    """SIGTERM, SIGINT, SIGINT: the third is a hard exit. Its line says what arrived (not "a
    third SIGINT"), and ``--json`` still ends with ``run/summary`` (128 + the first)."""
    tag = secrets.token_hex(8)
    proc, fifo = _held(tmp_path, tag)
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGINT):
            _deliver(proc.pid, signum)
    finally:
        out, err = _release(proc, fifo)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGINT as the third signal (SIGTERM, SIGINT, SIGINT)" in err
    assert "a third time" not in err and "Traceback" not in err
    summary = json.loads(out.splitlines()[-1])
    assert summary["type"] == "run/summary" and summary["exit_code"] == 143
    entry = f"ANDON_SIGNAL_CASE={tag}".encode()
    assert not alive_after(procs.tagged(entry, exclude=(os.getpid(),)), timeout=5.0)


def _reading_stdin(pid: int) -> bool:
    """Whether ``pid`` is blocked in ``read(0, ...)`` (``/proc/PID/syscall``: number, then args)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return fields[:2] == ["0", "0x0"]


def test_a_signal_while_the_forkserver_is_started_ahead_stops_before_anything_started(
    tmp_path: Path,
) -> None:
    """``andon run`` starts the forkserver first thing (andon.cli._prestart_forkserver): a
    SIGINT in that spawn window is a stop before anything started, and the forkserver, spawned
    all the same by its thread, is stopped at the exit: nothing is left, no session exists."""
    tag = secrets.token_hex(8)
    model = script(tmp_path / "m.json", [{"text": "ok"}])
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    session = tmp_path / "s"
    args = ["run", "--json", "--session", str(session), "--model", model, "go"]
    environ = env(ANDON_SIGNAL_CASE=tag, HOLD_SPAWN=str(fifo), PRESTART="1")
    proc = start_slow(tmp_path, args, environ, until="spawn window held")
    try:
        _deliver(proc.pid, signal.SIGINT)
    finally:
        out, err = _release(proc, fifo)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "stopped before anything started" in err and "Traceback" not in err
    assert not session.exists()
    assert json.loads(out.splitlines()[-1])["exit_code"] == 130
    entry = f"ANDON_SIGNAL_CASE={tag}".encode()
    assert not alive_after(procs.tagged(entry, exclude=(os.getpid(),)), timeout=5.0)


def test_json_prints_the_summary_for_a_signal_before_the_session_exists(tmp_path: Path) -> None:
    """A signal while ``andon run --json`` reads its prompt from stdin (before the session
    exists): one line on stderr, exit 128 + n, and ``run/summary`` as the last stdout line."""
    model = script(tmp_path / "m.json", [{"text": "ok"}])
    session = tmp_path / "s"
    proc = subprocess.Popen(
        [ANDON, "run", "--json", "--session", str(session), "--model", model],
        cwd=tmp_path,
        env=env(),
        stdin=subprocess.PIPE,  # open, and nothing comes: andon waits for its prompt
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not _reading_stdin(proc.pid) and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.01)  # sleep-ok: polling /proc for the read of stdin, with a deadline
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err
    assert "SIGTERM: stopped before anything started" in err and "Traceback" not in err
    assert not session.exists()
    summary = json.loads(out.splitlines()[-1])
    assert summary["type"] == "run/summary"
    assert summary["exit_code"] == 143 and summary["session"] is None
    assert summary["turns"] == 0 and summary["ended"] is None


def test_a_signal_while_the_forkserver_still_imports_stops_at_once(tmp_path: Path) -> None:
    """The first worker's start waits for the forkserver, which answers only once it has
    imported the worker modules (held here for good, as a busy machine holds it for seconds).
    A signal then stops the run within the bound: that wait is not on the event loop."""
    model = script(tmp_path / "m.json", [{"text": "ok"}])
    tag = secrets.token_hex(8)
    args = ["run", "--json", "--grace", "1,1", "--session", str(tmp_path / "s"), "--model", model]
    proc = start_held(tmp_path, [*args, "go"], env(ANDON_SIGNAL_CASE=tag))
    out, err, took = signal_and_wait(proc, signal.SIGTERM, BOUND + 20)  # far above the bound
    assert proc.returncode == 143, err
    assert took <= BOUND, f"took {took:.2f}s after the signal"
    assert json.loads(out.splitlines()[-1])["exit_code"] == 143
    assert "Traceback" not in err
    entry = f"ANDON_SIGNAL_CASE={tag}".encode()
    assert not alive_after(procs.tagged(entry, exclude=(os.getpid(),)), timeout=5.0)
