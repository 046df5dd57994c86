"""Leftover processes of tool calls whose supervisor died: found from ``tool/started``, then killed.

Workers kill their tool's process group when the supervisor dies, so finding anything here means
that safety net failed too (the worker was killed with it, or hung). Crash repair kills what it
finds before it writes a call's outcome-unknown result: a result saying "stopped" while the tool
still writes into the workspace would be a lie.

Never touch a stranger. A pid alone proves nothing (pids are reused), so:

* a process counts only if its pid **and** its start time match what the log recorded, or it
  descends from (or shares the process group of) such a verified leader and started after it;
* a group whose leader is gone is **not** reached through its pgid: the number may have been
  reused, and nothing left on disk can prove otherwise. The call's own cgroup (when the log records
  one, and it lies under a cgroup2 mount) still reaches those processes;
* the kill goes through a pidfd opened *before* the start time is checked again, so the process
  checked is the process signalled even if its pid is recycled in between;
* only calls that ran on this host are considered (a remote worker's processes are not ours).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from andon.session._records import ToolStarted

__all__ = ["Leftover", "LeftoverPlan", "find_leftovers", "kill_leftovers"]

# psutil derives start times from boot time + clock ticks (1/100 s); the worker records the same
# value through psutil, so they agree exactly. The tolerance only absorbs float formatting.
CREATE_TIME_TOLERANCE = 0.05
KILL_WAIT = 5.0


@dataclass(frozen=True, slots=True)
class Leftover:
    """A live process that belongs to a tool call of a dead supervisor."""

    call_id: str
    pid: int
    create_time: float
    via: Literal["leader", "descendant", "group", "cgroup"]


@dataclass(frozen=True, slots=True)
class LeftoverPlan:
    """What repair would kill: processes, and cgroups to ``cgroup.kill``."""

    processes: tuple[Leftover, ...] = ()
    cgroups: tuple[Path, ...] = ()


def _same_start(a: float, b: float) -> bool:
    return abs(a - b) <= CREATE_TIME_TOLERANCE


def _live(proc: psutil.Process) -> float | None:
    """The start time of a live, non-zombie process, or None."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.Error:
        return None


def _cgroup2_mounts() -> list[Path]:
    mounts: list[Path] = []
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    mounts.append(Path(parts[1]))
    except OSError:
        pass
    return mounts


def _trusted_cgroup(recorded: str) -> Path | None:
    """The recorded cgroup folder, if it exists, lies under a cgroup2 mount and can be killed."""
    path = Path(recorded)
    if not path.is_absolute() or ".." in path.parts:
        return None
    if not any(mount in path.parents for mount in _cgroup2_mounts()):
        return None
    return path if (path / "cgroup.kill").exists() else None


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def find_leftovers(
    started: Iterable[tuple[str, ToolStarted]], *, host: str | None = None
) -> LeftoverPlan:
    """The live processes (and cgroups) of the given ``(call_id, tool/started)`` pairs."""
    this_host = host if host is not None else socket.gethostname()
    me = os.getpid()
    found: dict[int, Leftover] = {}
    cgroups: list[Path] = []
    for call_id, s in started:
        if s.host != this_host:
            continue
        try:
            leader = psutil.Process(s.pid)
        except psutil.Error:
            leader = None
        leader_start = _live(leader) if leader is not None else None
        if (
            leader is not None
            and leader_start is not None
            and _same_start(leader_start, s.create_time)
        ):
            found.setdefault(s.pid, Leftover(call_id, s.pid, leader_start, "leader"))
            try:
                children = leader.children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                start = _live(child)
                if start is not None and start >= s.create_time - CREATE_TIME_TOLERANCE:
                    found.setdefault(child.pid, Leftover(call_id, child.pid, start, "descendant"))
            # The leader is verified, so its group id is too: members that left the tree
            # (re-parented after a double fork) are still in the group.
            for proc in psutil.process_iter():
                if proc.pid in found or proc.pid == me:
                    continue
                try:
                    if os.getpgid(proc.pid) != s.pgid:
                        continue
                except OSError:
                    continue
                start = _live(proc)
                if start is not None and start >= s.create_time - CREATE_TIME_TOLERANCE:
                    found[proc.pid] = Leftover(call_id, proc.pid, start, "group")
        if s.cgroup is not None:
            path = _trusted_cgroup(s.cgroup)
            if path is not None:
                cgroups.append(path)
                for pid in _cgroup_pids(path):
                    if pid in found or pid == me:
                        continue
                    start = _live(psutil.Process(pid)) if psutil.pid_exists(pid) else None
                    if start is not None:
                        found[pid] = Leftover(call_id, pid, start, "cgroup")
    found.pop(me, None)
    return LeftoverPlan(tuple(found.values()), tuple(cgroups))


def kill_leftovers(plan: LeftoverPlan, *, wait: float = KILL_WAIT) -> int:
    """SIGKILL everything in ``plan`` and wait (bounded) until it has exited; returns how many
    processes were killed (ones that had exited meanwhile are not counted)."""
    pidfds: list[int] = []
    killed = 0
    try:
        for lf in plan.processes:
            try:
                fd = os.pidfd_open(lf.pid)
            except OSError:  # gone already
                continue
            try:
                start = _live(psutil.Process(lf.pid))
            except psutil.Error:
                start = None
            # Checked after the pidfd is open: if this is still the same process now, the pidfd
            # refers to it, and a later pid reuse cannot redirect the signal.
            if start is None or not _same_start(start, lf.create_time):
                os.close(fd)
                continue
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                os.close(fd)
                continue
            killed += 1
            pidfds.append(fd)
        for cgroup in plan.cgroups:
            # Catches whatever was forked after the scan, and anything the scan could not see.
            with contextlib.suppress(OSError):
                (cgroup / "cgroup.kill").write_text("1")
        _wait_exited(pidfds, wait)
    finally:
        for fd in pidfds:
            os.close(fd)
    return killed


def _wait_exited(pidfds: list[int], timeout: float) -> None:
    """Block until every pidfd reports its process exited, or ``timeout`` passes."""
    if not pidfds:
        return
    poller = select.poll()
    pending = set(pidfds)
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        for fd, _ in poller.poll(remaining * 1000):
            poller.unregister(fd)
            pending.discard(fd)
