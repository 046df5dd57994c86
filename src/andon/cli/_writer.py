"""Writing the CLI's output without ever blocking the event loop.

A reader that stops reading (``andon run | less`` on its first screen, a terminal paused with
Ctrl-S, a log shipper applying back-pressure) makes a blocking ``write`` to its pipe wait for as
long as the reader likes. Done on the event-loop thread, that wait froze signals, tool timeouts
and the grace timeline. So stdout and stderr are written through a :class:`Writer`: the loop only
appends to a bounded in-memory buffer, and a thread of the writer's own does the blocking writes.

Invariants (the loop's side of each is what keeps signals and timers alive):

* :meth:`Writer.write` never waits on the reader: its lock is held for deque operations only,
  never across a system call;
* past ``limit`` bytes buffered, whole lines are dropped and counted in :attr:`Writer.dropped`;
  never half a line: the keep-or-drop decision is taken when a line starts, and a line already
  begun is finished, so the bound is overshot by at most one line;
* EPIPE (the reader went away) sets :attr:`Writer.broken`, points the fd at ``/dev/null`` so that
  nothing later (a flush at interpreter exit) fails again, and discards what is still buffered;
  any other write error is kept in :attr:`Writer.error` for the loop to raise;
* at exit :meth:`Writer.drain` waits while the reader makes progress, but never forever: the
  thread is a daemon, so a reader that never reads again cannot keep the process alive.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "STDERR_LIMIT",
    "STDOUT_LIMIT",
    "Writer",
    "can_stall",
    "drain_writers",
    "settle_others",
    "stderr_writer",
]

STDOUT_LIMIT: Final = 8 << 20  # bytes buffered for stdout before whole lines are dropped
STDERR_LIMIT: Final = 64 << 10  # diagnostics are few and short
_CHUNK: Final = 64 << 10  # at most this much per write(2): the buffer shrinks as the reader reads
# At interpreter exit: give up on stderr once it has taken nothing for this long.
_ATEXIT_STALL: Final = 2.0
_ATEXIT_CAP: Final = 5.0

_lock = threading.Lock()
_writers: list[Writer] = []  # started writers, drained (bounded) at interpreter exit
_stderr: Writer | None = None


def can_stall(fd: int) -> bool:
    """Whether a write to ``fd`` can wait on a reader: a pipe, a socket or a terminal. A regular
    file (or a closed fd) cannot, and is written directly."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


def stderr_writer() -> Writer | None:
    """The process's writer for fd 2, or None when fd 2 cannot stall (then write it directly)."""
    global _stderr
    with _lock:
        if _stderr is None and can_stall(2):
            _stderr = Writer(2, limit=STDERR_LIMIT, name="stderr")
        return _stderr


def settle_others(writer: Writer, timeout: float) -> None:
    """Wait at most ``timeout`` in all for every other writer to write what it has queued, so a
    line for ``writer`` comes after them where both streams end up in one place (``2>&1``)."""
    deadline = time.monotonic() + timeout
    with _lock:
        others = [w for w in _writers if w is not writer]
    for other in others:
        other.settle(other.position, max(0.0, deadline - time.monotonic()))


class Writer:
    """Text for ``fd``, written by a thread of its own through a buffer of at most ``limit`` bytes.

    Only the event loop calls :meth:`write` (one producer); the thread is the one consumer."""

    def __init__(
        self, fd: int, *, limit: int = STDOUT_LIMIT, name: str = "stdout", encoding: str = "utf-8"
    ) -> None:
        self.fd = fd
        self.name = name
        self.limit = limit
        self.encoding = encoding
        self.dropped = 0  # lines dropped because the reader did not keep up
        self.broken = False  # EPIPE: the reader went away
        self.error: OSError | None = None  # any other write error
        self._cond = threading.Condition()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._pending = 0  # bytes queued or being written
        self._queued = 0  # bytes ever queued (positions for settle())
        self._written = 0  # bytes ever written
        self._line_start = True
        self._dropping = False  # the line under way is being dropped
        self._stalled = False  # a settle() timed out and the buffer has not emptied since
        self._thread: threading.Thread | None = None
        self._on_broken: list[Callable[[], None]] = []

    # -- the loop's side ------------------------------------------------------------------------

    def write(self, text: str, *, whole: bool = False, force: bool = False) -> int:
        """Queue ``text`` and return the position :meth:`settle` waits for.

        Lines are cut at ``\\n`` and each is kept or dropped as a whole; ``whole=True`` treats the
        text as one unit (a terminal frame, whose escape sequences must not be split). ``force``
        keeps it past the bound (the summary, the terminal's cursor restore)."""
        if not text:
            return self._queued
        if whole:
            pieces = [text]
        else:
            parts = text.split("\n")
            pieces = [p + "\n" for p in parts[:-1]]
            if parts[-1]:
                pieces.append(parts[-1])
        with self._cond:
            if self.broken or self.error is not None:
                return self._queued
            for piece in pieces:
                if self._line_start:
                    self._dropping = not force and self._pending >= self.limit
                    if self._dropping:
                        self.dropped += 1
                self._line_start = whole or piece.endswith("\n")
                if self._dropping:
                    continue
                data = piece.encode(self.encoding, "replace")
                self._chunks.append(data)
                self._pending += len(data)
                self._queued += len(data)
            self._start()
            self._cond.notify_all()
            return self._queued

    @property
    def position(self) -> int:
        """Bytes ever queued: :meth:`settle` on it waits for everything queued so far."""
        return self._queued

    @property
    def pending(self) -> int:
        """Bytes queued and not written yet."""
        return self._pending

    def on_broken(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the writer thread: make it thread-safe, e.g. through
        ``loop.call_soon_threadsafe``) when the reader goes away."""
        with self._cond:
            if not self.broken:
                self._on_broken.append(callback)
                return
        callback()

    def settle(self, position: int, timeout: float) -> bool:
        """Wait at most ``timeout`` for everything up to ``position`` to be written; for callers
        that want their line out now (a diagnostic before ``os._exit``, stderr after the stdout
        lines it comments on). Once a wait times out, later ones return at once until the buffer
        empties: a stalled reader costs the loop one ``timeout`` per stall, not one per line."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._written < position and self._pending:
                if self.broken or self.error is not None or self._stalled:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    self._stalled = True
                    return False
                self._cond.wait(left)
            return True

    def drain(self, stall: float, cap: float) -> bool:
        """Wait until everything queued is written: while the reader takes something at least every
        ``stall`` seconds, and never longer than ``cap`` in all. True when all was written."""
        now = time.monotonic()
        deadline = now + cap
        with self._cond:
            last, since = self._written, now
            while self._pending and not self.broken and self.error is None:
                now = time.monotonic()
                if self._written != last:
                    last, since = self._written, now
                left = min(deadline - now, since + stall - now)
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.error is None and not self.broken

    # -- the writer thread ----------------------------------------------------------------------

    def _start(self) -> None:  # under self._cond
        if self._thread is not None:
            return
        # A daemon: at exit drain() bounds the wait, and a reader that never reads again must
        # not keep the process alive by a thread stuck in write(2).
        self._thread = threading.Thread(target=self._run, name=f"andon-{self.name}", daemon=True)
        self._thread.start()
        with _lock:
            first = not _writers
            _writers.append(self)
        if first:
            atexit.register(drain_writers)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks:
                    self._cond.wait()
                buf = bytearray()
                while self._chunks and len(buf) < _CHUNK:
                    buf += self._chunks.popleft()
            view = memoryview(buf)
            try:
                while view:
                    try:
                        n = os.write(self.fd, view)
                    except BlockingIOError:
                        # Someone set O_NONBLOCK on the shared file description: wait, off the loop.
                        writable = select.poll()  # poll: select refuses fds >= 1024
                        writable.register(self.fd, select.POLLOUT)
                        writable.poll()
                        continue
                    view = view[n:]
                    with self._cond:
                        self._pending -= n
                        self._written += n
                        if not self._pending:
                            self._stalled = False
                        self._cond.notify_all()
            except OSError as e:
                self._fail(e)
                return

    def _fail(self, e: OSError) -> None:
        epipe = isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE
        with self._cond:
            if epipe:
                self.broken = True
            else:
                self.error = e
            self._chunks.clear()
            self._pending = 0
            callbacks, self._on_broken = self._on_broken, []
            self._cond.notify_all()
        if epipe:
            # Later writes (a flush of sys.stdout at interpreter exit) must not fail again.
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.fd)
                os.close(devnull)
            for callback in callbacks:
                with contextlib.suppress(Exception):  # a closed loop: the run is over anyway
                    callback()


def drain_writers() -> None:
    # stdout is drained by the view's summary (with its own, longer bound); this is for
    # what was said on stderr last (the text-mode summary, "the turn failed"), and for stdout when
    # the run ended without a summary.
    with _lock:
        writers = list(_writers)
    for writer in writers:
        writer.drain(_ATEXIT_STALL, _ATEXIT_CAP)
