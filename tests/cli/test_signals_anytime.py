"""A signal at any moment is a stop like any other (docs/ci.md, Timeouts and cancellation).

SIGINT and SIGTERM land at seeded moments across start-up (interpreter, argument parsing, pool
start, log open) and across teardown (after the turn ended), to the pid and to the whole process
group, and in bursts. Every run: the exit status is 128 + the first signal (or, for a signal
after the exit code was decided, that code), never death by the signal itself; ``run/summary``
agrees with the status; no traceback; nothing of the run left; no session, or one ``check``
accepts.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from andon import procs
from tests.cli.support import LONG, env, run, script, start
from tests.support import alive_after

SEED = 20261203
GRACE_BOUND = 30.0  # far above the grace policy (1 s + 1 s): a bound, not a figure


@dataclass(frozen=True)
class Case:
    name: str
    signals: tuple[int, ...]  # sent back to back
    delay: float  # seconds after the start (or after turn/end, for teardown)
    group: bool  # to the whole process group instead of the pid
    teardown: bool = False


def _cases() -> list[Case]:
    rng = random.Random(SEED)
    cases: list[Case] = []
    for n in range(20):
        sig = (signal.SIGINT, signal.SIGTERM)[n % 2]
        cases.append(Case(f"start-{n}", (sig,), rng.uniform(0.0, 1.5), group=n % 4 >= 2))
    for n in range(20):
        sig = (signal.SIGTERM, signal.SIGINT)[n % 2]
        delay = rng.uniform(0.0, 0.3)
        cases.append(Case(f"end-{n}", (sig,), delay, group=n % 4 >= 2, teardown=True))
    bursts = [
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGINT, signal.SIGTERM),
        (signal.SIGHUP, signal.SIGINT),
    ]
    for n, burst in enumerate(bursts):
        cases.append(Case(f"burst-{n}", burst, rng.uniform(0.0, 1.2), group=n == 1))
        cases.append(Case(f"burst-late-{n}", burst, 0.0, group=n != 1, teardown=True))
    return cases


@dataclass
class Ran:
    case: Case
    status: int
    sent: bool  # the first signal reached a live process
    stdout: str
    stderr: str
    session: Path
    left: list[Any]


class _Lines:
    """A pipe read to its end by a thread; waiters are woken at every line."""

    def __init__(self, pipe: Any) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        with pipe:
            for line in pipe:
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        with self._cond:
            self.lines.append("")  # the end
            self._cond.notify_all()

    def wait_for(self, pred: Any, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: any(pred(x) or x == "" for x in self.lines), timeout)

    def text(self) -> str:
        self._thread.join(timeout=GRACE_BOUND)
        return "".join(self.lines)


def _one(case: Case, root: Path) -> Ran:
    folder = root / case.name
    folder.mkdir()
    if case.teardown:
        model = script(folder / "m.json", [{"text": "done"}])
    else:
        model = script(
            folder / "m.json",
            [{"tool_calls": [{"name": "bash", "arguments": {"command": LONG}}]}, {"text": "ok"}],
        )
    session = folder / "s"
    tag = f"ANDON_SIGNAL_CASE={secrets.token_hex(8)}"
    name, _, value = tag.partition("=")
    args = ["run", "--json", "--grace", "1,1", "--session", str(session), "--model", model]
    proc = start(*args, "go", cwd=folder, environ=env(**{name: value}))
    out, err = _Lines(proc.stdout), _Lines(proc.stderr)
    sent = False
    try:
        if case.teardown:  # from the turn's end on: the teardown
            out.wait_for(lambda line: '"turn/end"' in line, GRACE_BOUND)
        # A seeded moment of the run's life, not an ordering of a race: the point is to land
        # anywhere, including inside the interpreter's start-up.
        time.sleep(case.delay)  # sleep-ok: the signal's moment is the thing under test
        for n, sig in enumerate(case.signals):
            if proc.poll() is not None:
                break
            # Our own unreaped child leads this group (start_new_session), so the number is ours.
            if case.group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
            sent = sent or n == 0
            if n + 1 < len(case.signals):
                # Two signals pending at once are delivered in the kernel's order (by number),
                # whatever order they were sent in: a burst's order is only defined once andon
                # has said it saw the first (or it is past saying anything: teardown).
                signame = signal.Signals(sig).name
                err.wait_for(lambda line, s=signame: s in line, 3.0)
        proc.wait(timeout=GRACE_BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = alive_after(procs.tagged(tag.encode()), timeout=5.0)
    return Ran(case, proc.returncode, sent, out.text(), err.text(), session, left)


def _in_interpreter_start_up(r: Ran) -> bool:
    """Whether the first signal ended the process before andon's first line (docs/ci.md, Timeouts
    and cancellation): by its default action (a shell reports 128 + the signal's number all the
    same), or, for SIGINT, as CPython's own fatal start-up error: its handler is in place before
    the interpreter imports ``site`` and opens the standard streams, and a ``KeyboardInterrupt``
    there ends the process with exit code 1 and ``Fatal Python error: init_...``."""
    first = r.case.signals[0]
    if r.status == -first:
        return True
    return (
        first == signal.SIGINT
        and r.status == 1
        and r.stderr.startswith("Fatal Python error: init_")
        and "KeyboardInterrupt" in r.stderr
    )


@pytest.mark.timeout(600)
def test_a_signal_at_any_moment_is_a_clean_stop(tmp_path: Path) -> None:
    cases = _cases()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: _one(c, tmp_path), cases))
    problems: list[str] = []
    for r in results:
        c = r.case
        where = f"{c.name} ({'+'.join(signal.Signals(s).name for s in c.signals)} after "
        where += f"{c.delay:.3f}s{', group' if c.group else ''})"
        expected = 128 + c.signals[0]
        said = any(line.startswith("andon:") for line in r.stderr.splitlines())
        if not said and not r.session.exists() and _in_interpreter_start_up(r):
            # Inside the interpreter's own start-up, before the first line of andon runs (the
            # entry module installs the handlers first thing), with nothing started.
            continue
        if r.status < 0:
            problems.append(f"{where}: died of signal {-r.status}: {r.stderr[-500:]}")
        if "Traceback" in r.stderr:
            problems.append(f"{where}: traceback:\n{r.stderr[-2000:]}")
        if r.left:
            problems.append(f"{where}: left {[(p.pid, p.comm) for p in r.left]}")
        summaries = [
            json.loads(line)
            for line in r.stdout.splitlines()
            if line.startswith("{") and '"run/summary"' in line
        ]
        if summaries and summaries[-1]["exit_code"] != r.status:
            problems.append(f"{where}: exit {r.status} but run/summary says {summaries[-1]}")
        if c.teardown:
            # After the turn ended the exit code may already be decided (0), never anything else.
            if r.status not in (0, expected):
                problems.append(f"{where}: exit {r.status}, expected 0 or {expected}")
        elif r.sent and r.status != expected:
            problems.append(f"{where}: exit {r.status}, expected {expected}: {r.stderr[-500:]}")
        if (r.session / "events.jsonl").exists():
            check = run("check", str(r.session), cwd=tmp_path)
            if check.returncode != 0:
                problems.append(f"{where}: check: {check.stdout}{check.stderr}")
        elif r.session.exists():  # a folder appears only with its first record synced
            problems.append(f"{where}: a session folder without a log: {list(r.session.iterdir())}")
    assert not problems, "\n".join(problems)


def _start_ignoring(folder: Path, model: str, ignored: int) -> subprocess.Popen[str]:
    def ignore() -> None:  # runs in the child before exec: the disposition andon starts with
        signal.signal(ignored, signal.SIG_IGN)

    return start(
        *("run", "--json", "--grace", "1,1", "--session", str(folder / "s")),
        *("--model", model, "go"),
        cwd=folder,
        preexec_fn=ignore,
    )


def _until_tool_output(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line).get("type") == "tool/output":
            return
    raise AssertionError("the run ended before its tool printed")


def test_a_sighup_ignored_on_entry_stays_ignored(tmp_path: Path) -> None:
    command = "echo ready; sleep 1; echo built"
    model = script(
        tmp_path / "m.json",
        [{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}, {"text": "ok"}],
    )
    proc = _start_ignoring(tmp_path, model, signal.SIGHUP)
    try:
        _until_tool_output(proc)
        os.kill(proc.pid, signal.SIGHUP)  # nohup asked for this to be ignored
        out, err = proc.communicate(timeout=GRACE_BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["exit_code"] == 0


def test_a_sigint_ignored_on_entry_still_stops_the_run(tmp_path: Path) -> None:
    model = script(
        tmp_path / "m.json",
        [{"tool_calls": [{"name": "bash", "arguments": {"command": LONG}}]}, {"text": "ok"}],
    )
    proc = _start_ignoring(tmp_path, model, signal.SIGINT)
    try:
        _until_tool_output(proc)
        os.kill(proc.pid, signal.SIGINT)  # a CI job must always be able to stop its agent
        out, err = proc.communicate(timeout=GRACE_BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert json.loads(out.splitlines()[-1])["exit_code"] == 130


def test_sigterm_after_a_tool_killed_its_worker_still_stops_in_bounds(tmp_path: Path) -> None:
    model = script(
        tmp_path / "m.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "kill -9 $PPID"}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo second; " + LONG}}]},
            {"text": "ok"},
        ],
    )
    proc = start(
        *("run", "--json", "--grace", "1,1", "--session", str(tmp_path / "s")),
        *("--model", model, "go"),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        lost = False
        for line in proc.stdout:
            event = json.loads(line)
            if event.get("type") == "tool/result":
                lost = lost or (event["data"].get("error") or {}).get("code") == "WORKER_LOST"
            if event.get("type") == "tool/output" and "second" in event.get("text", ""):
                break
        assert lost, "the first call should have lost its worker"
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=GRACE_BOUND)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err
    # The grace policy is 1 s + 1 s: a bound far above it, not a figure.
    assert took < 15.0, f"stopping took {took:.1f}s after a lost worker"
    # Every diagnostic, log records of andon's own loggers included, carries the prefix.
    bare = [line for line in err.splitlines() if line and not line.startswith("andon:")]
    assert not bare, bare
