"""kill -9 of ``andon run`` at any moment of the worker pool's start leaves nothing of it alive
(docs/ci.md, Timeouts and cancellation): the forkserver dies with the thread that spawned it (a
parent-death signal), and a worker, connected or still starting, watches the supervisor with a
pidfd.

The start is made slow on purpose (``tests/cli/slow_start.py``: no worker says hello), and the
SIGKILL lands at seeded moments from the command's start: while the log opens, the forkserver
spawns or imports its modules, the workers fork, or wait for their hello.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from andon import procs
from tests.cli.support import SLOW_START, env, script, start_held
from tests.support import alive_after

SEED = 20261208
BOUND = 3.0  # nothing of andon's is alive this long after its SIGKILL


def _one(n: int, delay: float, root: Path) -> tuple[float, list[str]]:
    folder = root / f"kill-{n}"
    folder.mkdir()
    model = script(folder / "m.json", [{"text": "ok"}])
    value = secrets.token_hex(8)
    entry = f"ANDON_KILL_CASE={value}".encode()
    args = ["run", "--json", "--session", str(folder / "s"), "--model", model, "go"]
    proc = subprocess.Popen(
        [sys.executable, SLOW_START, *args],
        cwd=folder,
        env=env(ANDON_KILL_CASE=value),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(delay)  # sleep-ok: the moment of the kill is the thing under test
        proc.kill()  # the supervisor alone, as a runner's kill -9 of its pid
        proc.wait()
        left = alive_after(procs.tagged(entry, exclude=(os.getpid(),)), timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _end_all(entry)
    return delay, [f"pid {p.pid} (ppid {p.ppid})" for p in left]


@pytest.mark.timeout(300)
def test_kill_9_at_any_moment_of_the_start_leaves_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    delays = [rng.uniform(0.05, 3.0) for _ in range(20)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda a: _one(a[0], a[1], tmp_path), enumerate(delays)))
    problems = [f"kill -9 after {d:.3f}s: left {left}" for d, left in results if left]
    assert not problems, "\n".join(problems)


def test_kill_9_while_the_forkserver_still_starts_takes_it_down(tmp_path: Path) -> None:
    """The forkserver held in its start-up (its first preload module never returns, as an import
    on a machine at load 50 takes seconds): no line of it can watch anything yet, and it does
    not watch its socket yet. SIGKILL of andon must take it down all the same."""
    model = script(tmp_path / "m.json", [{"text": "ok"}])
    value = secrets.token_hex(8)
    entry = f"ANDON_KILL_CASE={value}".encode()
    args = ["run", "--json", "--session", str(tmp_path / "s"), "--model", model, "go"]
    proc = start_held(tmp_path, args, env(ANDON_KILL_CASE=value), stdout=subprocess.DEVNULL)
    try:
        helpers = procs.tagged(entry, exclude=(os.getpid(), proc.pid))
        assert helpers  # the forkserver (held)
        proc.kill()
        proc.wait()
        left = alive_after(procs.tagged(entry, exclude=(os.getpid(),)), timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _end_all(entry)
        if proc.stderr is not None:
            proc.stderr.close()
    assert not left, [f"pid {p.pid} (ppid {p.ppid})" for p in left]


def _end_all(entry: bytes) -> None:
    """SIGKILL whatever of a case outlived its bound (reported by the test): the suite's own
    leftover check comes after."""
    for p in procs.tagged(entry, exclude=(os.getpid(),)):
        handle = procs.Pidfd.open(p.key)
        if handle is not None:
            handle.send(signal.SIGKILL)
            handle.close()
