"""A sweep's /proc scan that races a fork-and-exit does not call the call's processes gone.

A scan lists /proc (or, walking the worker's subtree, the children lists), then reads each
entry. A member alive at the listing that forks and exits before its entry is read (``setsid``'s
parent half does exactly this) reads as a zombie, and the child it made is in no listing. Seen
once in a full CI run: a Python tool's ``setsid sleep 300`` outlived its cancelled call. Here a
small subreaper plays the worker, and the scan is hooked to make that moment happen every time,
between the listing and the read of the member's entry.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from andon import procs
    from andon.workers._containment import set_child_subreaper
    from andon.workers._group import CallProcesses
    from andon.workers._reaper import Reaper

    assert set_child_subreaper()
    go_r, go_w = os.pipe()
    hold_r, hold_w = os.pipe()  # the grandchild lives until this process ends (EOF)
    member = os.fork()
    if member == 0:
        os.close(go_w)
        os.close(hold_w)
        os.read(go_r, 1)
        if os.fork() == 0:
            os.read(hold_r, 1)  # blocks until the scripted worker is gone
            os._exit(0)
        os._exit(0)  # the parent half leaves at once: its child re-parents to us
    os.close(go_r)
    os.close(hold_r)

    real_fields = procs._stat_fields  # what every read of an entry goes through
    fired = False

    def fields(pid):
        global fired
        if pid == member and not fired:
            fired = True  # the listing is done: fork and exit now, before this entry is read
            os.write(go_w, b"x")
            os.waitid(os.P_PID, member, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped
        return real_fields(pid)

    procs._stat_fields = fields

    async def main():
        reaper = Reaper()
        reaper.install(asyncio.get_running_loop())
        group = CallProcesses(mode=sys.argv[1], worker_pid=os.getpid(), reaper=reaper)
        gone = await group.wait_gone(0.0)
        assert fired, "the scan never read the member's entry"
        left = [p.pid for p in group.members()]
        print(f"gone={gone} left={len(left)}", flush=True)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        reaper.uninstall()

    asyncio.run(main())
    for _ in range(2):  # the member, then the grandchild (killed above)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    """
)


@pytest.mark.parametrize("mode", ["subreaper", "cgroup"])
def test_a_scan_that_raced_a_fork_and_exit_is_not_conclusive(mode: str) -> None:
    # cgroup mode without a cgroup here scans /proc exactly as subreaper mode does.
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # The grandchild was alive all along: the scan must not have said "gone".
    assert done.stdout.strip() == "gone=False left=1", done.stdout + done.stderr
