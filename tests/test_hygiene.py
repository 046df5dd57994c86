"""The leftover-process check itself must be able to fail: it sees escapees that re-parented."""

from __future__ import annotations

import os
import select
import signal
import subprocess

import psutil

from tests.conftest import tagged_processes


def test_leftover_check_sees_a_double_forked_escapee() -> None:
    # The subshell forks a `setsid sleep` and exits at once: the sleep re-parents away from us.
    out = subprocess.run(
        ["bash", "-c", "( setsid sleep 300 >/dev/null 2>&1 & echo $! )"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    try:
        proc = psutil.Process(pid)
        assert proc.ppid() != os.getpid()
        assert pid in [p.pid for p in tagged_processes()]
    finally:
        fd = os.pidfd_open(pid)
        os.kill(pid, signal.SIGKILL)
        select.select([fd], [], [], 5)  # readable once it has exited (init reaps it later)
        os.close(fd)
    assert pid not in [p.pid for p in tagged_processes()]
