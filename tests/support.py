"""Helpers every test package shares: finding a test's own processes by their tag, and waiting,
with a bound, until they are gone.

A "nothing left" assertion never reads the process table once: a process killed a moment ago may
still be on its way out. It waits on pidfds (no polling, no sleep) up to a bound, then reports what
is still alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import select
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from andon import procs
from andon.base import call_tag
from andon.procs import ProcessKey, ProcInfo

__all__ = [
    "RUN_ENTRY",
    "alive_after",
    "call_entry",
    "can_force_pids",
    "escapee_tree",
    "keep_across_tests",
    "kept_pids",
    "leftovers",
    "procs_with_marker",
    "session_leftovers",
    "spawn_at_pid",
    "tagged_processes",
    "unkeep",
]

# Every process this test run starts inherits this variable (children, grandchildren, escapees
# that re-parent away with setsid or a double fork): the leftover check looks for exactly this
# run's tag, so a second copy of the suite on the same machine is never mistaken for ours.
RUN_TAG_VAR = "ANDON_TEST_RUN"
# Always fresh, never inherited: two suites started from one shell must not share a tag.
os.environ[RUN_TAG_VAR] = secrets.token_hex(8)
RUN_ENTRY = f"{RUN_TAG_VAR}={os.environ[RUN_TAG_VAR]}".encode()


# Tagged processes a session-long fixture keeps running from one test to the next (a model server
# started once per test process): the check after each test passes over them, the check at the end
# of the session does not, so one that its fixture failed to stop is still reported.
_kept: set[ProcessKey] = set()


def keep_across_tests(key: ProcessKey) -> None:
    """Let the tagged process ``key`` outlive the tests (not the session) without being reported."""
    _kept.add(key)


def unkeep(key: ProcessKey) -> None:
    _kept.discard(key)


def kept_pids() -> tuple[int, ...]:
    return tuple(k.pid for k in _kept)


def tagged_processes(*, include_kept: bool = False) -> list[ProcInfo]:
    """Live (non-zombie) processes, other than this one, that carry this run's tag (those kept
    across tests, :func:`keep_across_tests`, only when ``include_kept``)."""
    found = procs.tagged(RUN_ENTRY, exclude=(os.getpid(),))
    return found if include_kept else [p for p in found if p.key not in _kept]


def call_entry(owner: str, call_id: str) -> bytes:
    """The environment entry every process of ``owner``'s call ``call_id`` carries."""
    return procs.tag_entry(call_tag(owner, call_id))


def session_leftovers(
    folder: str | os.PathLike[str], call_id: str, timeout: float = 5.0
) -> list[ProcInfo]:
    """Processes of call ``call_id`` of the session in ``folder`` still alive after up to
    ``timeout``: found by the session's own tag, so another session's ``call_id`` never counts."""
    with open(os.path.join(folder, "events.jsonl"), "rb") as f:
        first = json.loads(f.readline())
    return leftovers(call_entry(first["data"]["session_id"], call_id), timeout)


def alive_after(found: Iterable[ProcInfo], timeout: float = 5.0) -> list[ProcInfo]:
    """Those of ``found`` still alive (and still the same processes) after up to ``timeout``."""
    opened = [(p, procs.Pidfd.open(p.key)) for p in found]
    fds = [fd for _, fd in opened if fd is not None]
    try:
        procs.wait_exited(fds, timeout)
        return [p for p, fd in opened if fd is not None and not fd.exited()]
    finally:
        for fd in fds:
            fd.close()


def escapee_tree(marker: str) -> str:
    """A bash command that starts a ``setsid`` escapee and a double-forked daemon (each a
    ``sleep 100N<marker>``), says ``ready`` once both run, then sleeps in the foreground ignoring
    SIGINT. The marker is joined only at run time, so the sleeps are the only processes whose
    command lines hold it (:func:`procs_with_marker` finds them, the shell not)."""
    head, tail = marker[: len(marker) // 2], marker[len(marker) // 2 :]
    return (
        f"A={head}; B={tail}; setsid sleep 1000$A$B & ( ( sleep 1001$A$B & ) & ); "
        f'until [ "$(pgrep -c -f "^sleep 100[01]$A$B")" -ge 2 ]; do :; done; '
        f"trap '' INT; echo ready; sleep 1002$A$B"
    )


def procs_with_marker(marker: str, wait: float = 0.0) -> list[ProcInfo]:
    """Live processes whose command line holds ``marker`` (a random string a test put there),
    still alive after up to ``wait`` seconds. For processes the test cannot tag through their
    environment (a container's, a remote worker's)."""
    needle = marker.encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in cmdline:
            info = procs.stat(int(entry.name))
            if info is not None and info.state != "Z":
                found.append(info)
    return alive_after(found, wait) if wait > 0 else found


def leftovers(entry: bytes, timeout: float = 5.0) -> list[ProcInfo]:
    """Processes carrying ``entry`` that are still alive after up to ``timeout``."""
    return alive_after(procs.tagged(entry), timeout)


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def can_force_pids() -> bool:
    """Whether this process may choose the next pid (root, with a writable ns_last_pid)."""
    return os.access(NS_LAST_PID, os.W_OK)


def spawn_at_pid(
    pid: int, argv: list[str], *, env: dict[str, str] | None = None, tries: int = 200
) -> subprocess.Popen[bytes] | None:
    """Start ``argv`` in its own session with exactly ``pid`` (which must be free): a stranger
    that took over a number andon once knew. None if another process kept taking the number.

    The kernel gives the next process ``ns_last_pid + 1``; anything else on the machine may fork
    in between, so a miss is killed (our own unreaped child) and the write retried.
    """
    for _ in range(tries):
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout


def wait_all_exited(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds) until every pid has exited; return those still alive at the deadline."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    poller = select.poll()  # poll: select refuses fds >= 1024, and a forking tree leaves many
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                fds.pop(fd)
                os.close(fd)
        return list(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def gated(fifo: Path) -> str:
    """A tool that prints ``ready``, then waits until the test opens the gate, then finishes."""
    return f"echo ready; read word < {fifo}; echo finished $word"


async def open_gate(fifo: Path) -> None:
    def write() -> None:
        fd = os.open(fifo, os.O_WRONLY)  # blocks until the tool has it open for reading
        try:
            os.write(fd, b"normally\n")
        finally:
            os.close(fd)

    await asyncio.to_thread(write)


def fifo_in(tmp_path: Path) -> Path:
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    return fifo
