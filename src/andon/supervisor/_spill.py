"""The spill file: a call's full output, kept by the supervisor (a remote worker never writes into
the session).

Small output stays in memory; once it outgrows what the result's content shows, it goes to
``tool-output/<call_id>.log`` (0600) in the session folder. Memory stays bounded whatever the tool
writes: only the head is kept in memory once the file is open.

Beyond the cap (:data:`DEFAULT_SPILL_CAP`, configurable) output is counted, not stored: a runaway
``yes`` must not fill the disk under the session. Writing never raises: a full disk (ENOSPC), a
wiped session folder, a path the OS refuses or a short write ends the spilling, not the call, and
:attr:`Spill.problem` says what happened so the result can tell the model. How the call ended is
never changed by it. (Anything else raising here would be an andon bug; the executor answers the
call ``INTERNAL`` then, and still stops it.)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_SPILL_CAP", "Spill"]

DEFAULT_SPILL_CAP = 256 * 1024 * 1024
"""Bytes of one call's output kept in its spill file (a long CI build log fits many times)."""


class Spill:
    def __init__(
        self,
        session_dir: Path | None,
        call_id: str,
        threshold: int,
        cap: int = DEFAULT_SPILL_CAP,
    ) -> None:
        self.session_dir = session_dir
        self.call_id = call_id
        self.threshold = threshold
        self.cap = max(cap, threshold)
        self.buffer = bytearray()
        self.total = 0  # every byte the call wrote
        self.stored = 0  # the bytes in the spill file
        self.fd: int | None = None
        self.relpath: str | None = None
        self.path: Path | None = None  # the spill file, once created
        self.problem: str | None = None  # why spilling stopped early, if it did
        self._stopped = False

    @property
    def elided(self) -> int:
        """Bytes counted but not stored in the spill file (beyond the cap, or after a failure)."""
        return self.total - self.stored if self.relpath is not None else 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if self.fd is not None:
            self._write(data)
            return
        if self._stopped:
            return
        self.buffer += data
        if len(self.buffer) <= self.threshold:
            return
        if self.session_dir is not None and self._open():
            self._write(bytes(self.buffer))
        del self.buffer[self.threshold :]  # keep only a head in memory

    def _open(self) -> bool:
        assert self.session_dir is not None
        folder = self.session_dir / "tool-output"
        path = folder / f"{self.call_id}.log"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except (OSError, ValueError) as e:  # ValueError: a path the OS cannot take (NUL, not text)
            self._fail(f"could not create {path}: {getattr(e, 'strerror', None) or e}")
            return False
        self.path = path
        self.relpath = f"tool-output/{self.call_id}.log"
        return True

    def _write(self, data: bytes) -> None:
        assert self.fd is not None
        room = self.cap - self.stored
        view = memoryview(data)[: max(0, room)]
        try:
            while view:  # a short write (a full disk, a signal) is not the end of the data
                written = os.write(self.fd, view)
                self.stored += written
                view = view[written:]
        except OSError as e:
            self._fail(f"could not write {self.path}: {e.strerror or e}")
            return
        if self.stored >= self.cap:
            self.close()
            self._stopped = True

    def _fail(self, problem: str) -> None:
        self.problem = problem
        self.close()
        self._stopped = True

    def head(self) -> bytes:
        return bytes(self.buffer)

    def note(self) -> str:
        """What the result says about the spill file, or "" when it holds everything."""
        if self.problem is not None:
            return f"[andon {self.problem}; {self.total - self.stored} bytes of output not stored]"
        if self.elided:
            return (
                f"[output beyond {self.cap} bytes was counted, not stored: "
                f"{self.elided} bytes elided from {self.relpath}]"
            )
        return ""

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
