"""Containment modes: how a worker makes sure it can find every process a tool call started.

* ``pgroup``: the tool runs in its own session and process group; ``killpg`` reaches every member
  that stayed in the group. Always available; escapees (``setsid``, double forks) are out of reach
  and are *reported* as unreachable, never claimed as stopped.
* ``subreaper``: the worker is also a child subreaper (``PR_SET_CHILD_SUBREAPER``), so orphans
  re-parent to it instead of to init and can be found as its descendants.
* ``cgroup``: subreaper plus a cgroup v2 leaf per call; the final kill is ``cgroup.kill``, which
  reaches even a process that left the process tree.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import Literal

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
    """Where cgroup v2 is mounted (it need not be /sys/fs/cgroup), if it is writable by us."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup2":
            root = Path(parts[1])
            options = parts[3].split(",")
            if "ro" in options:
                continue
            has_kill = (root / "cgroup.kill").exists() or _has_kill_support(root)
            if has_kill and os.access(root, os.W_OK):
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


class CgroupTree:
    """``<root>/andon-<supervisor pid>/`` with a leaf per worker and per call.

    The supervisor creates the top folder; each worker creates its own leaf and its call leaves.
    """

    def __init__(self, root: Path, supervisor_pid: int) -> None:
        self.base = root / f"andon-{supervisor_pid}"

    def create_base(self) -> None:
        self.base.mkdir(mode=0o755, exist_ok=True)

    def leaf(self, name: str) -> Path:
        path = self.base / name
        path.mkdir(mode=0o755, exist_ok=True)
        return path

    @staticmethod
    def enter(path: Path, pid: int = 0) -> None:
        """Move ``pid`` (0 = this process) into the cgroup at ``path``."""
        (path / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")

    @staticmethod
    def pids(path: Path) -> list[int]:
        try:
            return [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    @staticmethod
    def kill(path: Path) -> bool:
        """SIGKILL everything in the cgroup, atomically with respect to forks."""
        try:
            (path / "cgroup.kill").write_text("1\n")
            return True
        except OSError:
            return False

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
        ``andon-<pid>`` folder behind). A tree is stale only if its pid is gone; anything still
        inside is SIGKILLed through ``cgroup.kill`` first. Returns how many trees were removed."""
        removed = 0
        for base in root.glob("andon-*"):
            try:
                pid = int(base.name.removeprefix("andon-"))
                os.kill(pid, 0)
                continue  # alive (or a reused pid): not ours to touch
            except ValueError:
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
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
