"""The session lock: one live supervisor per session folder.

A session is *live* while a process holds an exclusive ``flock`` on ``session_dir/lock``. The
kernel drops the lock when the holder dies, however it dies, so a kill -9 never leaves a session
looking live. The lock file is opened ``O_CLOEXEC`` (a tool started through exec never inherits it,
so it can never keep a dead supervisor's session locked) and is never deleted: unlinking a lock
file races with a process that has just opened it, and two holders would follow.

After locking, the holder writes ``{"pid", "host", "started"}`` into the file so that a refusal can
name it. The note is advisory only; the flock is the truth.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from andon.base import SessionLive, naming_file

__all__ = ["LockHolder", "SessionLock", "live_holder", "read_lock_holder"]

LOCK_NAME = "lock"


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds (or last held) a session's lock, as its lock file says."""

    pid: int | None
    host: str | None
    started: float | None

    def describe(self) -> str:
        if self.pid is None:
            return "another process (it has not written its name into the lock file yet)"
        where = f" on {self.host}" if self.host else ""
        since = ""
        if self.started is not None:
            since = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"process {self.pid}{where}{since}"


def _parse_holder(raw: bytes) -> LockHolder:
    try:
        note = json.loads(raw.decode("utf-8"))
    except ValueError:  # empty, or caught half-written: the holder is not named yet
        return LockHolder(None, None, None)
    if not isinstance(note, dict):
        return LockHolder(None, None, None)
    pid, host, started = note.get("pid"), note.get("host"), note.get("started")
    return LockHolder(
        pid if type(pid) is int else None,
        host if isinstance(host, str) else None,
        float(started) if isinstance(started, int | float) else None,
    )


def read_lock_holder(session_dir: str | os.PathLike[str]) -> LockHolder | None:
    """The holder note of a session's lock file (``None`` if there is no lock file).

    This does not say whether the lock is held now; only :meth:`SessionLock.acquire` can.
    """
    try:
        with open(Path(session_dir) / LOCK_NAME, "rb") as f:
            return _parse_holder(f.read(4096))
    except FileNotFoundError:
        return None


def live_holder(session_dir: str | os.PathLike[str]) -> LockHolder | None:
    """The holder of a session's lock if another process holds it now (the session is live),
    else ``None``. Takes nothing for longer than one non-blocking ``flock`` attempt (a shared
    lock, released at once), writes nothing, and never creates the lock file."""
    try:
        fd = os.open(Path(session_dir) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # never locked: no process ever opened it for writing
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _parse_holder(os.pread(fd, 4096, 0))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class SessionLock:
    """An acquired session lock. Release it exactly once (``release`` is idempotent)."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, session_dir: str | os.PathLike[str]) -> SessionLock:
        """Take the lock without waiting; ``SessionLive`` names the holder if another has it.

        Two opens in the same process are two holders too (flock belongs to the open file), so a
        ``load`` while this process's own writer is open is refused like any other.
        """
        folder = Path(session_dir)
        path = folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _parse_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise SessionLive(
                f"session {folder} is live: {holder.describe()} holds its lock. Stop that process "
                "(or wait for it to finish) before loading or repairing the session.",
                session=str(folder),
                pid=holder.pid,
                host=holder.host,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.fchmod(fd, 0o600)
            note = json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
            ).encode()
            # Overwrite in place, then cut: a reader sees the old note, the new one, or (for an
            # instant) an unparsable mix that it reports as "not named yet"; never a wrong name.
            with naming_file(path):  # a full disk names the lock file
                os.pwrite(fd, note, 0)
                os.ftruncate(fd, len(note))
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the holder note and unlock. Safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # A stale note would name a process that no longer holds anything.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
