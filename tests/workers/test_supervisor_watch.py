"""A local worker watches its supervisor by pid *and* start time (docs/workers.md, Starting
workers): a supervisor killed while the worker was still being forked may have its pid reused by
the time the worker looks, and the worker must not take that stranger for it (it would wait for a
welcome that never comes, for ever)."""

from __future__ import annotations

import os
import subprocess
import sys

from andon import procs

CHILD = """
import sys
from andon.workers import WorkerOptions, default, worker_main
pid, start = int(sys.argv[1]), int(sys.argv[2])
worker_main(WorkerOptions(
    endpoint="ipc:///nonexistent/andon-test.sock", worker_id="w1", registry=default(),
    supervisor_pid=pid, supervisor_start=start, detach=False,
))
"""


def _run_worker(pid: int, start: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(pid), str(start)],
        capture_output=True,
        text=True,
        timeout=30,  # a worker that took the stranger for its supervisor would wait for ever
        stdin=subprocess.DEVNULL,
    )


def test_a_worker_whose_supervisor_pid_now_names_another_process_exits_at_once() -> None:
    me = procs.stat(os.getpid())
    assert me is not None
    # This test's process stands for the stranger that reused the dead supervisor's pid.
    done = _run_worker(os.getpid(), me.start + 1)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
