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

    def members(self, *, reap: bool = True, include_zombies: bool = False) -> list[ProcInfo]:
        """Live processes of the call (zombies of our own children are reaped first)."""
        if reap:
            self.reaper.reap()
        if not self.maybe_any():
            return []
        if self.cgroup is not None:
            # Every process of the call is in its cgroup (leaving it takes a cgroup write that a
            # tool cannot make by accident): read the members instead of scanning all of /proc.
            in_cgroup = (proc_info(pid) for pid in CgroupTree.pids(self.cgroup))
            return [
                p
                for p in in_cgroup
                if p is not None and p.pid != self.worker_pid and (include_zombies or not p.zombie)
            ]
        procs = list(scan())
        found: dict[int, ProcInfo] = {}
        if self.pgid is not None:
            for p in procs:
                if p.pgid == self.pgid:
                    found[p.pid] = p
        if self.mode != "pgroup":
            for p in descendants(self.worker_pid, procs):
                found[p.pid] = p
        found.pop(self.worker_pid, None)
        return [p for p in found.values() if include_zombies or not p.zombie]

    def maybe_any(self) -> bool:
        """A cheap test (no /proc scan) that can only err on the side of "maybe"."""
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, 0)
                return True
            except ProcessLookupError:
                pass
            except PermissionError:
                return True
        if self.mode != "pgroup" and _has_children():
            # As a subreaper, every descendant of the call is a child of the worker or below one.
            return True
        return self.cgroup is not None and bool(CgroupTree.pids(self.cgroup))

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

    def stop(self, sig: int, *, group_only: bool) -> list[ProcInfo]:
        """Signal first, count after; return the processes it reached.

        Latency matters here (this is the moment a user waits for), so the group gets its
        ``killpg`` (and a SIGKILL its ``cgroup.kill``) before anything is scanned. The count that
        follows includes members that are already zombies: they were alive when signalled. With
        ``group_only`` False, members outside the group (strays) are then signalled one by one.
        """
        # With a cgroup, membership is cheap to read and must be read first: a process that dies
        # leaves cgroup.procs at once (no zombie stays listed). Without one, a /proc scan is the
        # expensive part and comes after the signal; zombies then still show who was reached.
        before = self.members(reap=False, include_zombies=True) if self.cgroup else None
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
        if sig == _signal.SIGKILL and self.cgroup is not None:
            CgroupTree.kill(self.cgroup)
        # No reaping before counting: the leader's zombie still counts as reached.
        members = before if before is not None else self.members(reap=False, include_zombies=True)
        reached = [m for m in members if self.pgid is not None and m.pgid == self.pgid]
        if not group_only:
            for m in members:
                if m.pgid != self.pgid and not m.zombie and _signal_exact(m, sig):
                    reached.append(m)
        return reached

    async def wait_gone(self, timeout: float) -> bool:
        """Wait until no member is left; False on timeout. Event-driven, never a polling loop.

        As a subreaper, the last descendant to exit is always a child of the worker by then (its
        parent died first, or it was one already), so every "maybe done" moment follows a reap:
        wait on the reaper and re-check cheaply. In ``pgroup`` mode members need not be our
        children, so wait on a pidfd per member instead.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            generation = self.reaper.generation
            self.reaper.reap()
            if not self.maybe_any():
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            if self.mode == "pgroup":
                members = self.members()
                if not members:
                    return True
                await _wait_any_exit(members, left)
            else:
                await self.reaper.wait_change(generation, left)

    def unreachable(self) -> list[ProcInfo]:
        """Processes carrying the call's tag that are outside what the mode can signal.

        Only meaningful in ``pgroup`` mode, where escapees are reported rather than killed.
        """
        if self.tag is None:
            return []
        reachable = {p.pid for p in self.members()}
        exclude = {os.getpid(), self.worker_pid, *reachable}
        return with_environ_entry(self.tag, exclude=exclude)


def _has_children() -> bool:
    """Whether this process has any child at all (running or exited), without reaping one."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


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
