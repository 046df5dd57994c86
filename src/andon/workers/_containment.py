"""Containment modes: how a worker makes sure it can find every process a tool call started.

* ``pgroup``: the tool runs in its own session and process group; ``killpg`` reaches every member
  that stayed in the group. Always available; escapees (``setsid``, double forks) are found by the
  call's environment tag (one that also scrubbed its environment is out of reach).
* ``subreaper``: the worker is also a child subreaper (``PR_SET_CHILD_SUBREAPER``), so orphans
  re-parent to it instead of to init and can be found as its descendants.
* ``cgroup``: subreaper plus a cgroup v2 leaf per call; the final kill is ``cgroup.kill``, which
  reaches even a process that left the process tree.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from andon import procs
from andon.base import Containment, ContainmentSetting

__all__ = [
    "CgroupTree",
    "cgroup2_root",
    "detect_mode",
    "set_child_subreaper",
    "set_parent_death_signal",
]


_PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """Make this process a child subreaper; False if the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent ends (0: no longer)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def cgroup2_root() -> Path | None:
    """A writable cgroup v2 mount with ``cgroup.kill`` support (kernel >= 5.14), if there is one."""
    for root, writable in procs.cgroup2_mounts():
        if writable and ((root / "cgroup.kill").exists() or _has_kill_support(root)):
            return root
    return None


def _has_kill_support(root: Path) -> bool:
    # The root cgroup has no cgroup.kill of its own; any child cgroup would. Kernel >= 5.14.
    release = os.uname().release.split(".")
    try:
        major, minor = int(release[0]), int(release[1].split("-")[0])
    except (IndexError, ValueError):
        return False
    return (major, minor) >= (5, 14) and (root / "cgroup.procs").exists()


def detect_mode(setting: ContainmentSetting = "auto") -> Containment:
    """The strongest mode available (for ``auto``) or the one forced, if it is available.

    ``ValueError`` if a forced mode is not available here.
    """
    if setting == "pgroup":
        return "pgroup"
    if setting in ("auto", "cgroup") and cgroup2_root() is not None:
        return "cgroup"
    if setting == "cgroup":
        raise ValueError("containment 'cgroup' needs a writable cgroup v2 hierarchy")
    return "subreaper"


_BASE = re.compile(r"andon-([0-9]+)-s([0-9]+)-ns([0-9]+)-[0-9a-f]{8,32}")


@dataclass(frozen=True, slots=True)
class TreeOwner:
    """The supervisor a tree's name says made it: pid and start time, as its pid namespace sees
    them (a pid means another process, or nothing, in any other namespace)."""

    pid: int
    start: int  # clock ticks since boot
    pidns: int  # the inode of its pid namespace


class CgroupTree:
    """``<root>/andon-<pid>-s<start>-ns<pid namespace>-<random>/`` with a leaf per worker and
    per call.

    The name proves whose tree it is to a later supervisor sweeping stale trees: the pid and its
    start time (a reused pid is another process), and the pid namespace they are numbers in. The
    cgroup hierarchy is shared by every pid namespace of the machine (a container's andon, one
    under ``unshare --pid``), and a pid that does not exist in one namespace may be a live
    supervisor in another: only trees of the sweeper's own namespace are judged. The random part
    makes the tree unique even for two pools in one process. The pool creates the top folder and
    hands its path to its workers; each worker creates its own leaf and its call leaves
    (``call-<call tag>``, unique across sessions).
    """

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def new(cls, root: Path, supervisor_pid: int) -> CgroupTree:
        """A tree for the supervisor ``supervisor_pid`` (this process, normally). ``ValueError``
        if that process or this pid namespace cannot be read (no tree then: containment falls
        back)."""
        info, pidns = procs.stat(supervisor_pid), procs.pid_namespace()
        if info is None or pidns is None:
            raise ValueError(f"cannot read the identity of process {supervisor_pid}")
        name = f"andon-{supervisor_pid}-s{info.start}-ns{pidns}-{secrets.token_hex(4)}"
        return cls(root / name)

    @staticmethod
    def parse_base(name: str) -> TreeOwner | None:
        """The supervisor an ``andon-…`` folder name names, or None if it is not one (an older
        name without the start time and namespace is not judged either)."""
        match = _BASE.fullmatch(name)
        return TreeOwner(int(match[1]), int(match[2]), int(match[3])) if match else None

    def create_base(self) -> None:
        self.base.mkdir(mode=0o755, exist_ok=True)

    def leaf(self, name: str) -> Path:
        path = self.base / name
        path.mkdir(mode=0o755, exist_ok=True)
        return path

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is a leaf of this tree (a path a worker reported, checked)."""
        return path.parent == self.base and path.name.startswith(("call-", "worker-"))

    @staticmethod
    def enter(path: Path, pid: int = 0) -> None:
        """Move ``pid`` (0 = this process) into the cgroup at ``path``."""
        (path / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")

    @staticmethod
    def pids(path: Path) -> list[int]:
        return procs.cgroup_pids(path)

    @staticmethod
    def kill(path: Path) -> bool:
        """SIGKILL everything in the cgroup, atomically with respect to forks."""
        return procs.cgroup_kill(path)

    @staticmethod
    def remove(path: Path) -> bool:
        """Remove an (empty) cgroup folder; False if it still has members or is gone."""
        try:
            path.rmdir()
            return True
        except OSError as e:
            return e.errno == errno.ENOENT

    @staticmethod
    def sweep_stale(root: Path) -> int:
        """Remove the trees of supervisors that died without cleaning up (kill -9 leaves its
        folder behind). A tree is stale only if it was made in this pid namespace and its
        supervisor (pid and start time) no longer runs; anything still inside is SIGKILLed
        through ``cgroup.kill`` first: only andon puts processes in these folders. A tree of
        another namespace is never judged (its pid numbers mean other processes here). Returns
        how many trees were removed."""
        ours = procs.pid_namespace()
        if ours is None:
            return 0
        removed = 0
        for base in root.glob("andon-*"):
            owner = CgroupTree.parse_base(base.name)
            if owner is None or owner.pidns != ours or not base.is_dir():
                continue
            info = procs.stat(owner.pid)
            if info is not None and info.start == owner.start:
                continue  # its supervisor runs: not ours to touch
            for leaf in base.iterdir():
                if leaf.is_dir():
                    CgroupTree.kill(leaf)
                    CgroupTree.remove(leaf)
            if CgroupTree.remove(base):
                removed += 1
        return removed

    def remove_all(self) -> None:
        """Remove every leaf and the top folder (after their processes are gone)."""
        if not self.base.exists():
            return
        for child in self.base.iterdir():
            if child.is_dir():
                self.kill(child)
                self.remove(child)
        self.remove(self.base)
