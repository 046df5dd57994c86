"""Leftover processes of tool calls whose supervisor died: found from ``tool/started``, then killed.

Workers kill their tool's process group when the supervisor dies, so finding anything here means
that safety net failed too (the worker was killed with it, or hung). Crash repair kills what it
finds before it writes a call's outcome-unknown result: a result saying "stopped" while the tool
still writes into the workspace would be a lie.

Never touch a stranger. A pid alone proves nothing (pids are reused, and call ids repeat in every
session), and neither does a start time: clock ticks are 1/100 s, and a pid forced back into use
(or wrapped on a busy machine) can come back within the same tick. So a process counts only if it
started no earlier than the recorded leader **and** one of these holds:

* it carries the call's tag (``ANDON_CALL_TAG=<session id>-<call id>``, unique to this session's
  call; the recorded leader itself is reported as ``leader``);
* it is in the call's cgroup **and** carries the tag, when the log records a cgroup whose path
  proves it andon's and this call's: under a cgroup2 mount, in a folder ``andon-<pid>-<random>``,
  named ``call-<tag>``. The cgroup is then also killed as a whole (``cgroup.kill`` reaches a fork
  that raced the scan), but only if every member carries the tag: a path read from a log may be
  stale or tampered with.

A group id or a parent chain proves nothing once the leader may be gone, so neither is used. Signals
go through verified pidfds (``andon.procs``), and only calls that ran on this host count.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from andon import procs
from andon.base import call_tag
from andon.procs import CallIdentity, ProcessKey, ProcInfo
from andon.session._records import ToolStarted
from andon.session._tail import Tail
from andon.session._values import MAX_SECONDS, is_pid

__all__ = [
    "Leftover",
    "LeftoverPlan",
    "StartedCall",
    "find_leftovers",
    "kill_leftovers",
    "plan_for",
]

KILL_WAIT = 5.0

# The folder a pool creates (``andon-<pid>-s<start>-ns<pid namespace>-<random>``, or
# ``andon-<pid>-<random>`` before the start and namespace were added); the bare ``andon-<pid>``
# of older versions is not unique across pools and is never trusted here.
_POOL_FOLDER = re.compile(r"andon-[0-9]+(?:-s[0-9]+-ns[0-9]+)?-[0-9a-f]{8,}")

Via = Literal["leader", "tag", "cgroup"]


@dataclass(frozen=True, slots=True)
class StartedCall:
    """A dangling call's ``tool/started``, with the tag its processes carry (None if the log does
    not say which session it is)."""

    call_id: str
    tag: str | None
    started: ToolStarted


@dataclass(frozen=True, slots=True)
class Leftover:
    """A live process that belongs to a tool call of a dead supervisor."""

    call_id: str
    pid: int
    create_time: float
    via: Via


@dataclass(frozen=True, slots=True)
class LeftoverPlan:
    """What repair would kill: the processes found, and per call what names them."""

    processes: tuple[Leftover, ...] = ()
    calls: tuple[tuple[CallIdentity, tuple[ProcInfo, ...]], ...] = ()
    """(what names the call, the processes found for it)."""


def started_calls(
    session_id: str | None, started: Iterable[tuple[str, ToolStarted]]
) -> list[StartedCall]:
    """Pair each ``(call_id, tool/started)`` with the call's tag."""
    out = []
    for call_id, s in started:
        try:
            tag = call_tag(session_id, call_id) if session_id else None
        except ValueError:  # an id this version would not write: no tag to trust
            tag = None
        out.append(StartedCall(call_id, tag, s))
    return out


def plan_for(tail: Tail) -> LeftoverPlan:
    """The leftovers of the calls a log (folded into ``tail``) leaves started and unanswered."""
    started = [(d.call_id, s) for d in tail.dangling() if d.called for s in d.started]
    return find_leftovers(started_calls(tail.session_id, started)) if started else LeftoverPlan()


def _trusted_cgroup(recorded: str | None, tag: str | None) -> Path | None:
    """The recorded cgroup folder, if its path proves it is this call's own."""
    if recorded is None or tag is None:
        return None
    path = Path(recorded)
    if not path.is_absolute() or ".." in path.parts:
        return None
    if path.name != f"call-{tag}" or not _POOL_FOLDER.fullmatch(path.parent.name):
        return None
    if not any(mount in path.parents for mount, _ in procs.cgroup2_mounts()):
        return None
    return path if (path / "cgroup.procs").exists() else None


def find_leftovers(calls: Iterable[StartedCall], *, host: str | None = None) -> LeftoverPlan:
    """The live processes (and cgroups) of the given dangling calls."""
    this_host = host if host is not None else socket.gethostname()
    mine = [c for c in calls if c.started.host == this_host]
    if not mine:
        return LeftoverPlan()
    everything = procs.snapshot()
    seen: set[int] = {procs.own_key().pid}
    leftovers: list[Leftover] = []
    plans: list[tuple[CallIdentity, tuple[ProcInfo, ...]]] = []
    for call in mine:
        identity, found = _find_one(call, everything, seen)
        seen.update(found)
        leftovers.extend(
            Leftover(call.call_id, p.pid, p.key.create_time, via) for p, via in found.values()
        )
        plans.append((identity, tuple(p for p, _ in found.values())))
    return LeftoverPlan(tuple(leftovers), tuple(plans))


def _plausible(s: ToolStarted) -> bool:
    """Whether the leader's recorded identity is one a kernel could have reported. The reader
    refuses any other in a log; this guards a ``ToolStarted`` built in memory."""
    return is_pid(s.pid) and is_pid(s.pgid) and 0 <= s.create_time <= MAX_SECONDS


def _find_one(
    call: StartedCall, everything: list[ProcInfo], seen: set[int]
) -> tuple[CallIdentity, dict[int, tuple[ProcInfo, Via]]]:
    s = call.started
    found: dict[int, tuple[ProcInfo, Via]] = {}
    if not _plausible(s):
        return CallIdentity(call.tag), found  # no proof of a start time: touch nothing
    leader = ProcessKey.from_create_time(s.pid, s.create_time)

    def add(p: ProcInfo, via: Via) -> None:
        if p.pid not in seen and not p.zombie and p.start >= leader.start:
            found.setdefault(p.pid, (p, "leader" if p.key == leader else via))

    if call.tag is not None:
        for p in procs.tagged(procs.tag_entry(call.tag), procs=everything):
            add(p, "tag")
    cgroup = _trusted_cgroup(s.cgroup, call.tag)
    if cgroup is not None and call.tag is not None:
        # The path alone comes from the log, which may be stale or tampered with: a member
        # counts only if it carries the tag too (and the cgroup.kill that also reaches a fork
        # racing the scan is written only if every member does).
        entry = procs.tag_entry(call.tag)
        for pid in procs.cgroup_pids(cgroup):
            info = procs.stat(pid)
            if info is not None and procs.carries(pid, entry):
                add(info, "cgroup")
    return CallIdentity(call.tag, leader, cgroup), found


def kill_leftovers(plan: LeftoverPlan, *, wait: float = KILL_WAIT) -> int:
    """SIGKILL everything in ``plan`` and wait (bounded) until it has exited; returns how many
    processes were killed (ones that had exited meanwhile are not counted)."""
    killed = 0
    for identity, found in plan.calls:
        if found or identity.cgroup is not None:
            # Not owned: kill_call writes cgroup.kill only if every member carries the tag.
            killed += procs.kill_call(identity, wait=wait, found=found)
    return killed
