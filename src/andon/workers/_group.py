"""The processes of one tool call, as the worker that runs it sees them, and how it stops them.

Membership is the union of what the containment mode can see: the call's process group, the
worker's descendants (as a subreaper, orphans re-parent to the worker), the call's cgroup, and, in
pgroup mode, the processes that carry the call's tag.

The group id is trusted only while the leader is **pinned**: the worker's own child, not yet
reaped, whose pid (and so the group id) cannot be reused. Then one ``killpg`` reaches every
member, even one forked a moment ago. Once the leader is reaped, the number may name a stranger's
group: members are then reached one by one through verified pidfds, and a process counts as a
group member only if it also carries the call's tag (pgroup mode) or is the worker's descendant
(subreaper modes, where the group adds nothing).

"Gone" means: no member is alive and every child of the worker that exited has been reaped. A
process the worker cannot reap (not its child) counts as gone once it is a zombie.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
from pathlib import Path
from typing import Final

from andon import procs
from andon.base import Containment
from andon.procs import ProcInfo
from andon.workers._reaper import Reaper

__all__ = ["CallProcesses"]

SETTLE: Final = 0.02
"""Seconds without a reap after which :meth:`CallProcesses.wait_gone` scans the members while
the cheap test still says some may be left."""


class CallProcesses:
    def __init__(
        self,
        *,
        mode: Containment,
        worker_pid: int,
        reaper: Reaper,
        pgid: int | None = None,
        cgroup: Path | None = None,
        tag: bytes | None = None,
        spare: int | None = None,
    ) -> None:
        self.mode = mode
        self.worker_pid = worker_pid
        self.reaper = reaper
        self.pgid = pgid  # the leader's pid: the worker's child, watched by the reaper
        self.cgroup = cgroup
        self.tag = tag  # an environment entry only this call's processes carry
        # The worker's spare call process (pinned, in its own group, no child of its own): the
        # worker's child during a shell call, and never a member of it.
        self._spare = spare

    @property
    def spare(self) -> int | None:
        """The spare's pid while it is pinned (a reaped spare's pid may be reused by anything,
        a process of this call included: it is then nobody to pass over)."""
        spare = self._spare
        return spare if spare is not None and self.reaper.holds(spare) else None

    @property
    def pinned(self) -> bool:
        """Whether the group id is still certainly the call's (its leader is not reaped)."""
        return self.pgid is not None and self.reaper.holds(self.pgid)

    def members(self, *, reap: bool = True, include_zombies: bool = False) -> list[ProcInfo]:
        """Live processes of the call (zombies of our own children are reaped first): the union
        of its cgroup, its process group, the worker's descendants (subreaper modes) and the
        processes carrying its tag (pgroup mode, where nothing else reaches an escapee).
        Leaving one of them (a setsid, a write to another cgroup's ``cgroup.procs``) does not
        hide a process while another still names it."""
        if reap:
            self.reaper.reap()
        if self.mode == "pgroup":
            return self._pgroup_members(include_zombies)
        if not self.maybe_any():
            return []
        found: dict[int, ProcInfo] = {}
        # With a cgroup, the /proc scan is needed only when something may have left it: a
        # process outside the cgroup that is ours is, as a subreaper's, below one of our children.
        spare = self.spare
        if self.cgroup is None or _has_children(spare):
            # As a subreaper, every process of the call is the worker's descendant (the group's
            # members too: nothing outside the call's session can join its group), so the walk
            # of the worker's own subtree finds them all without reading the whole machine.
            below = procs.subtree(self.worker_pid)
            if below is None:  # a kernel without children lists: the same from every process
                everything = procs.snapshot()
                if self.pinned:
                    found.update((p.pid, p) for p in everything if p.pgid == self.pgid)
                below = procs.descendants(self.worker_pid, everything)
            # A reaped leader's group id may belong to a stranger now; our descendants are ours.
            found.update((p.pid, p) for p in below)
        if self.cgroup is not None:  # what the walk did not find (one stat per process, not two)
            for pid in procs.cgroup_pids(self.cgroup):
                if pid not in found and (info := procs.stat(pid)) is not None:
                    found[pid] = info
        found.pop(self.worker_pid, None)
        if spare is not None:
            found.pop(spare, None)
        found.pop(os.getpid(), None)
        return [p for p in found.values() if include_zombies or not p.zombie]

    def _pgroup_members(self, include_zombies: bool) -> list[ProcInfo]:
        """Without a subreaper or a cgroup: the pinned group, and whatever carries the tag (a
        reaped leader's group id may belong to a stranger now, and an escapee that left the
        group re-parents to init: only the tag still says a process is ours). The tag scan is
        the "anything left?" test too, so it runs once, not once more in :meth:`maybe_any`."""
        found: dict[int, ProcInfo] = {}
        if self.pinned:
            found.update((p.pid, p) for p in procs.snapshot() if p.pgid == self.pgid)
        if self.tag is not None:
            # Its own scan, repeated while pids are handed out: an escapee that forks and
            # exits mid-scan must not take its child out of the count.
            for p in procs.tagged(self.tag, exclude=(self.worker_pid, os.getpid())):
                found.setdefault(p.pid, p)
        found.pop(self.worker_pid, None)
        found.pop(os.getpid(), None)
        return [p for p in found.values() if include_zombies or not p.zombie]

    def _cgroup_members(self) -> list[ProcInfo]:
        if self.cgroup is None:
            return []
        found = (procs.stat(pid) for pid in procs.cgroup_pids(self.cgroup))
        return [p for p in found if p is not None and p.pid != self.worker_pid]

    def maybe_any(self) -> bool:
        """A cheap test (no /proc scan, except for pgroup mode's tag) that can only err on the
        side of "maybe"."""
        # Signal 0 only asks; once the leader is reaped the answer may be a stranger's group,
        # which the scan that follows filters out.
        probe_group = self.pgid is not None and (self.pinned or self.mode == "pgroup")
        if probe_group and procs.killpg_pinned(self.pgid or 0, 0):
            return True
        if self.mode != "pgroup" and _has_children(self.spare):
            # As a subreaper, every descendant of the call is a child of the worker or below one.
            return True
        if self.cgroup is not None and procs.cgroup_pids(self.cgroup):
            return True
        if self.mode == "pgroup" and self.tag is not None:
            # Without a subreaper an escapee (setsid, double fork) re-parents to init: only its
            # tag still says it is ours.
            return bool(procs.tagged(self.tag, exclude=(self.worker_pid, os.getpid())))
        return False

    def signal(self, sig: int) -> int:
        """Send ``sig`` to every live member; return how many were targeted."""
        return len(self.stop(sig, group_only=False))

    def stop(self, sig: int, *, group_only: bool) -> list[ProcInfo]:
        """Signal first, count after; return the processes it reached.

        Latency matters here (this is the moment a user waits for), so a pinned group gets its
        ``killpg`` (and a SIGKILL its ``cgroup.kill``) before anything is scanned. The count that
        follows includes members that are already zombies: they were alive when signalled. With
        ``group_only`` False, members outside the group (strays) are then signalled one by one;
        once the group is no longer pinned, its members are signalled one by one too.
        """
        # With a cgroup, membership is cheap to read and must be read first: a process that dies
        # leaves cgroup.procs at once (no zombie stays listed). Without one, a /proc scan is the
        # expensive part and comes after the signal; zombies then still show who was reached.
        # A group-only stage to a pinned group reaches every member through its killpg: the
        # cgroup's list is then count enough, and the full union (a /proc scan) is not needed.
        before: list[ProcInfo] | None = None
        if self.cgroup is not None:
            before = (
                self._cgroup_members()
                if group_only and self.pinned
                else self.members(reap=False, include_zombies=True)
            )
        pinned = self.pinned
        if pinned:
            assert self.pgid is not None
            procs.killpg_pinned(self.pgid, sig)
        if sig == _signal.SIGKILL and self.cgroup is not None:
            procs.cgroup_kill(self.cgroup)
        # No reaping before counting: the leader's zombie still counts as reached.
        members = before if before is not None else self.members(reap=False, include_zombies=True)
        reached: list[ProcInfo] = []
        for m in members:
            in_group = m.pgid == self.pgid
            if in_group and pinned:
                reached.append(m)  # the killpg above reached it
            elif (in_group or not group_only) and not m.zombie and self._signal_one(m, sig):
                reached.append(m)
        return reached

    def _signal_one(self, member: ProcInfo, sig: int) -> bool:
        """Signal one member exactly. The worker's own child (the leader, or an orphan it adopted
        as a subreaper: most of what a stop finds) is signalled by its number, which cannot name
        a stranger while the child is unreaped, and only the reaper reaps, on this loop, never
        during this synchronous pass: two system calls instead of a verified pidfd's six."""
        if member.ppid == self.worker_pid:
            return procs.kill_child(member.pid, sig)
        return procs.signal_key(member.key, sig)

    async def wait_gone(self, timeout: float) -> bool:
        """Wait until no member is left; False on timeout. Event-driven, never a polling loop.

        As a subreaper, the last descendant to exit is always a child of the worker by then (its
        parent died first, or it was one already), so every "maybe done" moment follows a reap:
        wait on the reaper and re-check. In ``pgroup`` mode members need not be our children, so
        wait on a pidfd per member instead.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            generation = self.reaper.generation
            if self.mode != "pgroup" and self.maybe_any():
                # Members may still be dying (a stage just went out): wait for the reaper rather
                # than read every member while they exit, when a scan costs most (dozens of
                # exits compete with it) and finds them half gone. Only a spell of SETTLE with
                # nothing reaped earns a scan (a member that ignores the signal, say).
                left = deadline - loop.time()
                if left > 0:  # none left: the conclusive scan below, at once
                    await self.reaper.wait_change(generation, min(left, SETTLE))
                    if self.reaper.generation != generation:
                        continue
            found = self.members(include_zombies=True)
            members = [m for m in found if not m.zombie]
            if not members and not self._raced(found):
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            if self.mode == "pgroup":
                await _wait_all_exit(members, left)
            else:
                await self.reaper.wait_change(generation, left)

    def _raced(self, found: list[ProcInfo]) -> bool:
        """Whether a scan that found nothing alive may still have missed a process.

        A scan lists /proc, then reads each entry. A process alive at the listing that forks and
        exits before its entry is read shows up as a zombie, and its new child, born after the
        listing, is not in the scan at all (``setsid`` does just that: fork, then exit). The
        worker's own zombies were reaped right before the scan, so a zombie child of the worker
        in it died during the scan: only the next scan, after it is reaped, is conclusive. (A
        zombie whose parent is another member has a live parent in the scan anyway.) In pgroup
        mode the tag scan repeats itself for the same reason."""
        if self.mode == "pgroup":
            return False
        return any(p.zombie and p.ppid == self.worker_pid for p in found)


def _has_children(spare: int | None = None) -> bool:
    """Whether this process has any child at all (running or exited) but ``spare``, without
    reaping one. Can only err on the side of "maybe"."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    if spare is None:
        return True
    # A child other than the spare: each thread's children, as /proc lists them (a few small
    # reads, where a full scan reads every process's stat line). Complete here: only this
    # thread reaps (so no entry leaves the list mid-read), and every live descendant has an
    # ancestor, alive or a zombie not yet reaped, in the list.
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                if any(int(pid) != spare for pid in f.read().split()):
                    return True
    except (OSError, ValueError):
        return True  # no children files (an older kernel): maybe
    return False


async def _wait_all_exit(members: list[ProcInfo], timeout: float) -> None:
    """Return when all ``members`` have exited, or after ``timeout``; the caller rescans."""
    loop = asyncio.get_running_loop()
    fds = [fd for fd in (procs.Pidfd.open(m.key) for m in members) if fd is not None]
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
        loop.add_reader(fd.fd, on_exit, fd.fd)
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        pass
    finally:
        for fd in fds:
            loop.remove_reader(fd.fd)
            fd.close()
