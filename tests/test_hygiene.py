"""The leftover-process check itself must be able to fail: it sees escapees that re-parented."""

from __future__ import annotations

import os
import signal
import subprocess

from andon.base import procs
from tests.support import alive_after, tagged_processes


def test_leftover_check_sees_a_double_forked_escapee() -> None:
    # The subshell forks a `setsid sleep` and exits at once: the sleep re-parents away from us.
    out = subprocess.run(
        ["bash", "-c", "( setsid sleep 300 >/dev/null 2>&1 & echo $! )"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    info = procs.stat(pid)
    assert info is not None, "the escapee is already gone"
    try:
        assert info.ppid != os.getpid()
        assert pid in [p.pid for p in tagged_processes()]
    finally:
        # Not our child: reached through a pidfd verified against its start time, never a bare pid.
        assert procs.signal_key(info.key, signal.SIGKILL)
    assert alive_after([info], timeout=5.0) == []
    assert pid not in [p.pid for p in tagged_processes()]
