"""The processes of one tool call, and the one function that signals them.

Membership is the union of what the containment mode can see: the call's process group, the
worker's descendants (as a subreaper, orphans re-parent to the worker), and the call's cgroup. A
process is tracked as ``(pid, start ticks)`` and a stray is signalled through a pidfd opened after
checking its start time, so a reused pid is never touched.

"Gone" means: no member is alive and every child of the worker that exited has been reaped. A
process the worker cannot reap (not its child) counts as gone once it is a zombie.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
from pathlib import Path

from andon.workers._containment import CgroupTree, ContainmentMode
from andon.workers._procfs import ProcInfo, descendants, proc_info, scan, with_environ_entry
from andon.workers._reaper import Reaper

__all__ = ["CallProcesses"]


class CallProcesses:
    def __init__(
        self,
        *,
        mode: ContainmentMode,
        worker_pid: int,
        reaper: Reaper,
        pgid: int | None = None,
        cgroup: Path | None = None,
        tag: bytes | None = None,
    ) -> None:
        self.mode = mode
        self.worker_pid = worker_pid
        self.reaper = reaper
        self.pgid = pgid
        self.cgroup = cgroup
        self.tag = tag  # an environment entry only this call's processes carry

    def members(self) -> list[ProcInfo]:
        """Live processes of the call (zombies of our own children are reaped first)."""
        self.reaper.reap()
        procs = list(scan())
        found: dict[int, ProcInfo] = {}
        if self.pgid is not None:
            for p in procs:
                if p.pgid == self.pgid:
                    found[p.pid] = p
        if self.mode != "pgroup":
            for p in descendants(self.worker_pid, procs):
                found[p.pid] = p
        if self.cgroup is not None:
            by_pid = {p.pid: p for p in procs}
            for pid in CgroupTree.pids(self.cgroup):
                info = by_pid.get(pid) or proc_info(pid)
                if info is not None:
                    found[pid] = info
        found.pop(self.worker_pid, None)
        return [p for p in found.values() if not p.zombie]

    def signal(self, sig: int, members: list[ProcInfo] | None = None) -> int:
        """Send ``sig`` to every live member; return how many were targeted.

        The group gets one ``killpg`` (which also reaches a member forked a moment ago); members
        outside the group are signalled one by one through pidfds; SIGKILL also writes
        ``cgroup.kill`` where the call has a cgroup.
        """
        if members is None:
            members = self.members()
        if not members:
            return 0
        if self.pgid is not None and any(m.pgid == self.pgid for m in members):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
        for m in members:
            if m.pgid != self.pgid:
                _signal_exact(m, sig)
        if sig == _signal.SIGKILL and self.cgroup is not None:
            CgroupTree.kill(self.cgroup)
        return len(members)

    async def wait_gone(self, timeout: float) -> bool:
        """Wait (on pidfds, not by polling) until no member is left; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            members = self.members()
            if not members:
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await _wait_any_exit(members, left)

    def unreachable(self) -> list[ProcInfo]:
        """Processes carrying the call's tag that are outside what the mode can signal.

        Only meaningful in ``pgroup`` mode, where escapees are reported rather than killed.
        """
        if self.tag is None:
            return []
        reachable = {p.pid for p in self.members()}
        exclude = {os.getpid(), self.worker_pid, *reachable}
        return with_environ_entry(self.tag, exclude=exclude)


def _open_pidfd(info: ProcInfo) -> int | None:
    """A pidfd for exactly this process (pid and start time), or None if it is gone."""
    try:
        fd = os.pidfd_open(info.pid)
    except (ProcessLookupError, OSError):
        return None
    now = proc_info(info.pid)
    if now is None or now.start != info.start or now.zombie:
        os.close(fd)
        return None
    return fd


def _signal_exact(info: ProcInfo, sig: int) -> bool:
    fd = _open_pidfd(info)
    if fd is None:
        return False
    try:
        _signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)


async def _wait_any_exit(members: list[ProcInfo], timeout: float) -> None:
    """Return when all ``members`` have exited, or after ``timeout``; the caller rescans."""
    loop = asyncio.get_running_loop()
    fds = [fd for fd in (_open_pidfd(m) for m in members) if fd is not None]
    if not fds:
        return
    remaining = len(fds)
    done = loop.create_future()

    def on_exit(fd: int) -> None:
        nonlocal remaining
        loop.remove_reader(fd)
        remaining -= 1
        if remaining == 0 and not done.done():
            done.set_result(None)

    for fd in fds:
        loop.add_reader(fd, on_exit, fd)
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        pass
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)
