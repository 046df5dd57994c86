"""Finding, naming and signalling processes by number: the one place in andon that does it.

A layer of its own, just above ``andon.base`` (whose words it uses) and below everything that
touches a process: the session (crash repair finds a dead run's leftovers), the workers, the
fleet, the supervisor and the CLI. ``andon.base`` stays free of side effects on the system.
An internal face, with no stability promise (docs/architecture.md, Who the names are for).

Every other module (the worker's call processes, the pool, crash repair, the CLI's hard exit, the
benchmark, the test suite) goes through these functions; nothing else reads ``/proc/<pid>/stat``
or signals a process found by its number (``tests/test_one_place.py`` checks it). The one other
way a signal leaves andon is ``Popen.send_signal``/``terminate``/``kill`` on the caller's own
unreaped child, whose pid cannot have been reused.

**Identity.** A pid alone names nothing: pids are reused (a busy machine wraps them in minutes).
A process is named by a :class:`ProcessKey`, its pid and its start time in clock ticks since boot;
the pair is never reused. The same unit is used everywhere; the log's ``create_time`` (unix
seconds) is derived from it and converts back exactly on the same boot.

**Ownership.** Every process of a tool call carries the call's tag in its environment
(``ANDON_CALL_TAG=<session id>-<call id>``; see :func:`andon.base.call_tag`), unique across
sessions. Code that finds processes of a call it did not start itself (the pool after losing a
worker, crash repair, the benchmark, the tests) finds them by that tag, never by a call id or a
bare pid.

**Signalling.** A process found by a scan is signalled through a pidfd opened *before* its start
time is checked again (:class:`Pidfd`): if the check passes, the pidfd refers to that very process,
and a later pid reuse cannot redirect the signal. ``killpg`` of a number is allowed only while the
caller's own unreaped child leads the group (:func:`killpg_pinned`): until that child is reaped its
pid, and so the group id, cannot be reused.

``/proc/<pid>/stat`` is parsed by hand: a sweep reads every process on the machine, and reading
the stat file directly measured about five times faster than psutil's per-process calls
(≈0.5 ms against ≈2.5 ms for 71 processes). psutil serves only where /proc/stat has no boot time.
"""

from __future__ import annotations

import ctypes
import functools
import os
import select
import signal as _signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = [
    "CLK_TCK",
    "KILL_SETTLE",
    "TAG_SLOT",
    "TAG_VAR",
    "CallIdentity",
    "Pidfd",
    "ProcInfo",
    "ProcessKey",
    "carries",
    "cgroup2_mounts",
    "cgroup_kill",
    "cgroup_pids",
    "child_ended",
    "child_running",
    "cpu_time",
    "descendants",
    "find_call",
    "kill_call",
    "kill_child",
    "killpg_pinned",
    "own_key",
    "pid_namespace",
    "signal_group",
    "signal_groups",
    "signal_key",
    "signal_tagged",
    "snapshot",
    "stamp_tag",
    "stat",
    "subtree",
    "tag_entry",
    "tag_slot",
    "tagged",
    "wait_exited",
]

CLK_TCK: int = os.sysconf("SC_CLK_TCK")
KILL_SETTLE = 2.0
"""The longest :func:`kill_call` keeps rescanning for forks that raced its SIGKILL."""
TAG_VAR = "ANDON_CALL_TAG"


@functools.cache
def _boot_time() -> float:
    # ``btime`` of /proc/stat, as psutil reads it: a worker needs it for its first call's
    # ``create_time``, and psutil's imports would cost every worker about 10 ms.
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return float(psutil.boot_time())


@dataclass(frozen=True, slots=True, order=True)
class ProcessKey:
    """A process, unambiguously: its pid and its start time in clock ticks since boot."""

    pid: int
    start: int

    @property
    def create_time(self) -> float:
        """The start time as unix seconds (what the log records; psutil's value too)."""
        return _boot_time() + self.start / CLK_TCK

    @classmethod
    def from_create_time(cls, pid: int, create_time: float) -> ProcessKey:
        """The key of a process whose start the log recorded as unix seconds (same boot only:
        after a reboot the ticks point nowhere, and no process of the old boot exists)."""
        return cls(pid, round((create_time - _boot_time()) * CLK_TCK))


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One line of ``/proc/<pid>/stat``, the fields andon needs."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int  # clock ticks since boot

    @property
    def key(self) -> ProcessKey:
        return ProcessKey(self.pid, self.start)

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def pid_namespace() -> int | None:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), or None if unreadable.
    A pid is a number in one namespace: the same number names another process, or none, in any
    other, so a pid written down is only ever looked up in the namespace it was written in."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def stat(pid: int) -> ProcInfo | None:
    """The process's current stat line, or None if it is gone."""
    return _info(pid, _stat_fields(pid))


def _info(pid: int, fields: list[bytes] | None) -> ProcInfo | None:
    if fields is None:
        return None
    try:
        return ProcInfo(
            pid=pid,
            state=fields[0].decode(),
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            start=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 first)."""
    # os.open/os.read rather than open(): a sweep reads every process, and the file-object
    # machinery costs several times the system calls themselves.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name is in parentheses and may itself contain ") ": split at the last one.
    close = raw.rfind(b")")
    if close < 0:
        return None
    return raw[close + 2 :].split()


TAG_SLOT = "." * 160
"""The value ``ANDON_CALL_TAG`` has in the environment a worker's forkserver is started with: room
that :func:`stamp_tag` overwrites in a forked call process."""


def cpu_time(pid: int, *, reaped: bool = True) -> float:
    """CPU seconds process ``pid`` has used, every thread of it to the nanosecond, and (unless
    ``reaped`` is False) the children it has reaped (to the clock tick). For benchmarks: 0.0
    once it has gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    if not reaped:
        return total / 1e9
    fields = _stat_fields(pid)
    try:
        ticks = int(fields[13]) + int(fields[14]) if fields is not None else 0  # cutime, cstime
    except (IndexError, ValueError):
        ticks = 0
    return total / 1e9 + ticks / CLK_TCK


def tag_slot() -> int | None:
    """The address of this process's tag slot (see :func:`stamp_tag`), or None if it has none.
    Found ahead of time by a call process forked before its call (the slot is at the same
    address in every fork), so the stamp itself is one ``memmove``."""
    fields = _stat_fields(os.getpid())
    try:
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
        start = int(fields[47]) if fields is not None else 0  # field 50: env_start
    except (OSError, IndexError, ValueError):
        return None
    slot = f"{TAG_VAR}={TAG_SLOT}".encode()
    if block.startswith(slot + b"\0"):
        at = 0
    else:
        found = block.find(b"\0" + slot + b"\0")
        if found < 0:
            return None
        at = found + 1
    return None if start == 0 else start + at


def stamp_tag(tag: str, slot: int | None) -> bool:
    """Make this process (and every fork of it) carry ``tag`` in ``/proc/self/environ``.

    A forked Python call process has no exec of its own: what ``/proc`` shows as its environment
    is the block its ancestor was exec'd with, whatever ``os.environ`` says. The forkserver is
    exec'd with ``ANDON_CALL_TAG=<TAG_SLOT>``, so the block holds a slot; the tag is written into
    that memory in place (as setproctitle does for argv). ``slot`` is what :func:`tag_slot`
    found. False, changing nothing, when there is no slot (a worker not started by a pool) or
    the tag does not fit.
    """
    entry = tag_entry(tag)
    width = len(TAG_VAR) + 1 + len(TAG_SLOT)
    if slot is None or len(entry) > width:
        return False
    ctypes.memmove(slot, entry + b"\0" * (width - len(entry)), width)
    return True


def own_key() -> ProcessKey:
    """This process's key."""
    info = stat(os.getpid())
    assert info is not None  # /proc/<own pid> exists while we run
    return info.key


def snapshot() -> list[ProcInfo]:
    """Every process visible in /proc (threads excluded)."""
    found: list[ProcInfo] = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = stat(int(name))
            if info is not None:
                found.append(info)
    return found


def descendants(root: int, procs: Iterable[ProcInfo]) -> list[ProcInfo]:
    """Processes whose parent chain leads to ``root`` (``root`` itself excluded)."""
    children: dict[int, list[ProcInfo]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    found: list[ProcInfo] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child.pid)
    return found


def subtree(root: int) -> list[ProcInfo] | None:
    """The descendants of ``root`` (``root`` excluded), found by walking the kernel's list of
    each process's children (``/proc/PID/task/TID/children``), or ``None`` where the kernel has
    no such lists (then :func:`snapshot` and :func:`descendants` do the same from every process).

    The walk reads only the subtree: its cost follows the call's processes, not the machine's (a
    CI runner may have thousands; a snapshot reads every one, several times in one stop). A
    child whose pid was reused between the list and its ``stat`` has another parent and is
    skipped. Like a snapshot, the walk is not atomic: a process that forks and exits while it is
    read takes its new child out of the walk and stays behind as a zombie, which the caller
    takes as "look again" (``CallProcesses._raced`` in the worker)."""
    if not _children_lists():
        return None
    found: list[ProcInfo] = []
    seen = {root}
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
        parent, single = stack.pop()
        for pid in _children_of(parent, single):
            if pid in seen:
                continue
            fields = _stat_fields(pid)
            info = _info(pid, fields)
            if fields is None or info is None or info.ppid != parent:
                continue  # gone, or a reused pid that is someone else's now
            seen.add(pid)
            found.append(info)
            stack.append((pid, fields[17] == b"1"))  # num_threads: one thread, one list
    return found


def _children_of(pid: int, single: bool = False) -> list[int]:
    """The pids the kernel lists as children of any thread of ``pid`` (a subreaper's adopted
    orphans may hang under any of its threads); ``single``: it has one thread (most tools), whose
    list is the only one, so the thread folder need not be read."""
    if single:
        tids = [str(pid)]
    else:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return []
    out: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except OSError:
            continue
        finally:
            os.close(fd)
        out.extend(int(word) for word in b"".join(chunks).split())
    return out


_CHILDREN_LISTS: list[bool] = []  # looked up once: the kernel's CONFIG_PROC_CHILDREN


def _children_lists() -> bool:
    if not _CHILDREN_LISTS:
        tid = threading.get_native_id()
        _CHILDREN_LISTS.append(os.path.exists(f"/proc/{os.getpid()}/task/{tid}/children"))
    return _CHILDREN_LISTS[0]


def tag_entry(tag: str) -> bytes:
    """The environment entry every process of the call tagged ``tag`` carries."""
    return f"{TAG_VAR}={tag}".encode()


def carries(pid: int, entry: bytes) -> bool:
    """Whether the process's environment holds ``entry`` (``b"NAME=value"``).

    An exec replaces the image a moment before it sets up the new environment, and /proc reads
    an empty one in between: an empty read is looked at again for a few milliseconds, or a tool
    caught mid-``exec`` (``exec sleep 1000``) would pass for a stranger and outlive its call (seen
    under load, 1 trial in 100). A genuinely empty environment costs only those retries.
    """
    deadline = time.monotonic() + _EXEC_SETTLE
    while True:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            return False
        if environ or time.monotonic() >= deadline or _kernel_thread(pid):
            return entry in environ.split(b"\0")
        os.sched_yield()


_EXEC_SETTLE = 0.005
_PF_KTHREAD = 0x00200000


def _kernel_thread(pid: int) -> bool:
    """Kernel threads have no environment at all (some kernels read it as empty): no retry."""
    fields = _stat_fields(pid)
    try:
        return fields is not None and bool(int(fields[6]) & _PF_KTHREAD)  # field 9: flags
    except (IndexError, ValueError):
        return False


def tagged(
    entry: bytes, exclude: Iterable[int] = (), procs: Iterable[ProcInfo] | None = None
) -> list[ProcInfo]:
    """Live processes whose environment holds ``entry``.

    A scan of /proc is not atomic: a tagged process that forks after the listing and exits
    before it is read takes its child out of the scan. Scanning by itself (no ``procs``), this
    scans again while a pid was handed out during the scan (the kernel's last pid moved), a few
    times at most, and returns the union.
    """
    skip = set(exclude)

    def scan(candidates: Iterable[ProcInfo]) -> dict[int, ProcInfo]:
        return {
            p.pid: p
            for p in candidates
            if p.pid not in skip and not p.zombie and carries(p.pid, entry)
        }

    if procs is not None:
        return list(scan(procs).values())
    found: dict[int, ProcInfo] = {}
    for _ in range(_SCAN_PASSES):
        before = _last_pid()
        found.update(scan(snapshot()))
        if before is None or _last_pid() == before:
            break
    return list(found.values())


_SCAN_PASSES = 5


def _last_pid() -> int | None:
    """The pid the kernel handed out last in this pid namespace (None where unreadable)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


# -- signalling ------------------------------------------------------------------------------


class Pidfd:
    """A pidfd for exactly one process, verified by its start time after it was opened."""

    __slots__ = ("fd", "key")

    def __init__(self, fd: int, key: ProcessKey) -> None:
        self.fd = fd
        self.key = key

    @classmethod
    def open(cls, key: ProcessKey, *, zombie_ok: bool = False) -> Pidfd | None:
        """The pidfd of the process ``key`` names, or None if that process is gone (or is now
        a zombie, unless ``zombie_ok``)."""
        try:
            fd = os.pidfd_open(key.pid)
        except OSError:
            return None
        # Checked after opening: if the process is still the one named now, the fd refers to it.
        now = stat(key.pid)
        if now is None or now.start != key.start or (now.zombie and not zombie_ok):
            os.close(fd)
            return None
        return cls(fd, key)

    def send(self, sig: int) -> bool:
        """Signal the process; False if it has exited (or refuses us)."""
        try:
            _signal.pidfd_send_signal(self.fd, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def exited(self) -> bool:
        """Whether the process has exited (a pidfd polls readable from that moment).

        ``poll``, never ``select``: a kill of a call that forks fast holds thousands of pidfds at
        once, and ``select`` refuses a descriptor numbered 1024 or more."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Pidfd:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def signal_key(key: ProcessKey, sig: int) -> bool:
    """Signal exactly the process ``key`` names; False if it is gone."""
    fd = Pidfd.open(key)
    if fd is None:
        return False
    with fd:
        return fd.send(sig)


def killpg_pinned(pgid: int, sig: int) -> bool:
    """``killpg`` for a group whose leader is the caller's own child and not yet reaped.

    Only then is the number safe: an unreaped child keeps its pid, and so its group id, from
    being reused. Every caller must hold that guarantee (the worker checks its reaper); anything
    else is reached through :class:`Pidfd`. Signal 0 only asks whether the group exists.
    """
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def child_running(pid: int) -> bool:
    """Whether ``pid`` is the caller's own child and has not exited. Never reaps it (a zombie
    stays for its owner to reap): while it is unreaped its pid cannot be reused."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # not our child, or already reaped
        return False


def child_ended(pid: int) -> str | None:
    """How the caller's own child ``pid`` ended ("exit status 1", "killed by SIGKILL"), without
    reaping it; None while it runs. A child already reaped, or not ours, "ended" unsaid."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return "ended"
    if result is None:
        return None
    if result.si_code == os.CLD_EXITED:
        return f"exit status {result.si_status}"
    try:
        name = _signal.Signals(result.si_status).name
    except ValueError:
        name = f"signal {result.si_status}"
    return f"killed by {name}"


def kill_child(pid: int, sig: int) -> bool:
    """Signal the caller's own child ``pid`` if it has not exited (and not been reaped): an
    unreaped child keeps its pid, so the number cannot name a stranger. False if it has exited
    (a zombie waits to be reaped) or is not our child."""
    if not child_running(pid):
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def signal_group(anchor: Pidfd, sig: int) -> int:
    """Signal the process group led by ``anchor`` (a process that is not our child, such as a
    pool worker); return how many processes were reached.

    The members are found by a scan and opened as verified pidfds; they are signalled only if the
    anchor is still alive *after* that, which proves the group id was not reused in between (a
    live leader holds it). Nothing is signalled once the anchor has exited (what its calls left
    is found by their tags instead).
    """
    return signal_groups([anchor], sig)


def signal_groups(anchors: Iterable[Pidfd], sig: int) -> int:
    """:func:`signal_group` for several leaders at once, from one scan of ``/proc`` (a scan costs
    about as much as the signals: a pool closing its idle workers pays it once, not per worker)."""
    live = [a for a in anchors if not a.exited()]
    if not live:
        return 0
    pgids = {a.key.pid for a in live}
    members = [p for p in snapshot() if p.pgid in pgids and p.pid != p.pgid]
    opened = [(Pidfd.open(p.key), p.pgid) for p in members]
    fds = [(fd, pgid) for fd, pgid in opened if fd is not None]
    try:
        sent = 0
        for anchor in live:
            if anchor.exited():
                continue  # its group id may be reused: nothing of it is signalled
            # The anchor through its own pidfd, whatever its group: a worker that has not
            # reached its setsid yet leads no group, and must still get the signal.
            sent += int(anchor.send(sig))
            group = anchor.key.pid
            sent += sum(1 for fd, pgid in fds if pgid == group and fd.send(sig))
        return sent
    finally:
        for fd, _ in fds:
            fd.close()


def signal_tagged(entry: bytes, sig: int, *, exclude: Iterable[int] = (), wait: float = 0.0) -> int:
    """Signal every live process whose environment holds ``entry`` (this process excluded); wait
    up to ``wait`` seconds for them to exit; return how many were signalled.

    For processes that carry a tag of the caller's own making (a benchmark floor's, a test
    run's): the tag is the only proof of ownership, checked through a verified pidfd."""
    skip = {os.getpid(), *exclude}
    fds = [fd for fd in (Pidfd.open(p.key) for p in tagged(entry, skip)) if fd is not None]
    try:
        sent = [fd for fd in fds if fd.send(sig)]
        if wait > 0:
            wait_exited(sent, wait)
        return len(sent)
    finally:
        for fd in fds:
            fd.close()


def wait_exited(fds: Sequence[Pidfd], timeout: float) -> bool:
    """Block until every process in ``fds`` has exited, or ``timeout`` passes (True if all did)."""
    poller = select.poll()
    pending = {fd.fd for fd in fds if fd.fd >= 0}
    for fd in pending:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for fd, _ in poller.poll(remaining * 1000):
            poller.unregister(fd)
            pending.discard(fd)
    return True


# -- cgroups ---------------------------------------------------------------------------------


def cgroup2_mounts() -> list[tuple[Path, bool]]:
    """Every cgroup v2 mount point (it need not be /sys/fs/cgroup) and whether it is writable."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found: list[tuple[Path, bool]] = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup2":
            root = Path(parts[1])
            writable = "ro" not in parts[3].split(",") and os.access(root, os.W_OK)
            found.append((root, writable))
    return found


def cgroup_pids(path: Path) -> list[int]:
    """The members of the cgroup at ``path`` (none if it is gone)."""
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def cgroup_kill(path: Path) -> bool:
    """SIGKILL everything in the cgroup at ``path``, atomically with respect to forks."""
    try:
        (path / "cgroup.kill").write_text("1\n")
        return True
    except OSError:
        return False


# -- a call's processes, found from outside --------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """What names one tool call's processes for someone who did not start them.

    ``tag`` is the call's unique tag; ``leader`` the key its worker reported (None if it never
    did); ``cgroup`` the call's cgroup, already validated by the caller as andon's own.
    """

    tag: str | None
    leader: ProcessKey | None = None
    cgroup: Path | None = None


def find_call(
    call: CallIdentity, *, cgroup_owned: bool = False, exclude: Iterable[int] = ()
) -> list[ProcInfo]:
    """The live processes of ``call``: every process carrying its tag (started no earlier than
    its leader, when the leader is known), plus, when ``cgroup_owned`` (the caller created that
    cgroup itself), every member of its cgroup. Never a process found by pid or group alone."""
    skip = {os.getpid(), *exclude}
    earliest = call.leader.start if call.leader is not None else 0
    found: dict[int, ProcInfo] = {}
    if call.tag is not None:
        entry = tag_entry(call.tag)
        found = {p.pid: p for p in tagged(entry, skip) if p.start >= earliest}
    if call.cgroup is not None and cgroup_owned:
        for pid in cgroup_pids(call.cgroup):
            info = stat(pid)
            if info is not None and not info.zombie and pid not in skip:
                found.setdefault(pid, info)
    return sorted(found.values(), key=lambda p: p.pid)


def kill_call(
    call: CallIdentity,
    *,
    cgroup_owned: bool = False,
    wait: float = 0.0,
    found: Sequence[ProcInfo] | None = None,
) -> int:
    """SIGKILL the processes of ``call`` (as :func:`find_call` finds them, or ``found``); wait up
    to ``wait`` seconds for them to exit; return how many were killed.

    A process may fork between the scan and its SIGKILL, and its child (which inherits the tag)
    was in no scan: so once the killed processes have exited, the call is scanned again, until a
    scan finds nothing (bounded by ``max(wait, KILL_SETTLE)``). ``cgroup.kill`` (which reaches
    such a fork at once) is written only where every member is known to be the call's: a cgroup
    the caller owns, or one whose members all carry the tag.
    """
    deadline = time.monotonic() + max(wait, KILL_SETTLE)
    targets = list(found) if found is not None else find_call(call, cgroup_owned=cgroup_owned)
    killed = 0
    seen: set[ProcessKey] = set()
    while True:
        fds = [fd for fd in (Pidfd.open(p.key) for p in targets if p.key not in seen) if fd]
        try:
            sent = [fd for fd in fds if fd.send(_signal.SIGKILL)]
            killed += len(sent)
            seen.update(fd.key for fd in sent)
            _kill_cgroup_if_ours(call, cgroup_owned)
            left = deadline - time.monotonic()
            if not sent or left <= 0:
                break
            if not wait_exited(sent, left):
                break  # still dying (uninterruptible sleep): nothing more a rescan can do
        finally:
            for fd in fds:
                fd.close()
        targets = find_call(call, cgroup_owned=cgroup_owned)
    return killed


def _kill_cgroup_if_ours(call: CallIdentity, cgroup_owned: bool) -> None:
    if call.cgroup is None:
        return
    members = cgroup_pids(call.cgroup)
    entry = tag_entry(call.tag) if call.tag is not None else None
    if members and (
        cgroup_owned or (entry is not None and all(carries(pid, entry) for pid in members))
    ):
        cgroup_kill(call.cgroup)
