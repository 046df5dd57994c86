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
from pathlib import Path
from typing import Literal

from andon.base import procs

__all__ = [
    "CgroupTree",
    "ContainmentMode",
    "cgroup2_root",
    "detect_mode",
    "set_child_subreaper",
]

ContainmentMode = Literal["cgroup", "subreaper", "pgroup"]
ContainmentSetting = Literal["auto", "cgroup", "subreaper", "pgroup"]

_PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """Make this process a child subreaper; False if the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
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


def detect_mode(setting: ContainmentSetting = "auto") -> ContainmentMode:
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


_BASE = re.compile(r"andon-([0-9]+)(?:-([0-9a-f]{8,32}))?")


class CgroupTree:
    """``<root>/andon-<supervisor pid>-<random>/`` with a leaf per worker and per call.

    The random part makes the tree unique even for two pools in one process. The pool creates
    the top folder and hands its path to its workers; each worker creates its own leaf and its
    call leaves (``call-<call tag>``, unique across sessions).
    """

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def new(cls, root: Path, supervisor_pid: int) -> CgroupTree:
        return cls(root / f"andon-{supervisor_pid}-{secrets.token_hex(4)}")

    @staticmethod
    def parse_base(name: str) -> int | None:
        """The supervisor pid an ``andon-…`` folder name carries, or None if it is not one."""
        match = _BASE.fullmatch(name)
        return int(match[1]) if match else None

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
        """Remove the trees of supervisors that died without cleaning up (kill -9 leaves an
        ``andon-<pid>-<random>`` folder behind). A tree is stale only if its pid is gone; anything
        still inside is SIGKILLed through ``cgroup.kill`` first: only andon puts processes in
        these folders. Returns how many trees were removed."""
        removed = 0
        for base in root.glob("andon-*"):
            pid = CgroupTree.parse_base(base.name)
            if pid is None or not base.is_dir():
                continue
            if procs.stat(pid) is not None:
                continue  # alive (or a reused pid): not ours to touch
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
