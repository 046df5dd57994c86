"""The log writer: one live process appends, durably, and never leaves a bad line behind.

Written vs synced (docs/log-format.md, Durability):

* **Written.** ``append`` is one synchronous ``write`` of a whole line to a file opened
  ``O_APPEND``: never buffered in user space, so once it returns the kernel has the record and a
  kill -9 of this process cannot lose it. That is what lets ``followup()`` and ``cancel()`` be
  synchronous and still survive a process crash.
* **Synced.** ``fsync`` (surviving a machine crash) runs in one background thread. ``barrier()``
  awaits the sync that covers everything written before it was called; barriers that arrive while a
  sync runs share the next one, so a burst of them costs one or two fsyncs, not one each.

Durability modes: ``"barrier"`` (default: sync when a barrier asks), ``"every-record"`` (each
append syncs before returning) and ``"none"`` (never; benchmarks only).

A failed append (ENOSPC, EIO, EFBIG ...) is never ignored: the file is cut back to the end of the
last whole record (a short write must not leave half a line that later records would turn into
corruption), the open step and turn are closed once with ``LOG_WRITE_FAILED`` (if the disk allows),
and every later append raises ``LogWriteFailed``.

An append is also atomic against asynchronous exceptions: a ``KeyboardInterrupt`` (or whatever a
signal handler raises) can land between any two bytecodes of it, in a program that embeds andon
without the CLI's signal handlers. Once ``append`` has returned or raised, either the record is
whole in the file and the writer counts it, or none of it is in the file and the writer is as it
was; never a seq handed out twice, never half a line left for the next one to turn into
corruption. How: ``SessionLog._append_records``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeAlias

from andon.base import (
    Clock,
    ErrorCode,
    LogWriteFailed,
    SessionError,
    SessionLive,
    SystemClock,
    naming_file,
)
from andon.session._create import make_temporary, publish, remove_temporary
from andon.session._folds import StateFold
from andon.session._lock import SessionLock
from andon.session._reader import LOG_NAME, RecordStream, iter_records, log_path
from andon.session._records import EventData, Record, SessionStart, Unrecognized, encode_line
from andon.session._repair import (
    Keep,
    LoadedSession,
    ReadEnd,
    RepairReport,
    repair_children,
    repair_locked,
)
from andon.session._tail import ClosingTexts, Tail, closing_data
from andon.session._values import TurnFailed

__all__ = ["Durability", "FsyncFn", "ProbeFn", "SessionLog", "WriteFn"]

Durability: TypeAlias = Literal["barrier", "every-record", "none"]
_DURABILITIES = ("barrier", "every-record", "none")

WriteFn: TypeAlias = Callable[[int, bytes], int]
"""The file seam: ``write(fd, data) -> bytes written`` (``os.write``); tests inject faults here."""
FsyncFn: TypeAlias = Callable[[int], None]
"""``fsync(fd)`` (``os.fsync``)."""
ProbeFn: TypeAlias = Callable[[str], None]
"""A test seam called at each named point of an append (``SessionLog._append_records``) and of its
mending (``SessionLog._reconcile``); a test raises ``KeyboardInterrupt`` from it to land an
interrupt exactly there. Production passes none."""


def _no_probe(point: str) -> None:
    pass


WRITE_FAILURE_TEXTS = ClosingTexts(
    error_name="LogWriteFailed",
    unknown_message="the session log could not be written, so this call's outcome was not recorded",
    unknown_content=(
        "Error: the outcome of this tool call is unknown. andon could not write its session log "
        "while the call was pending, so the call may have run fully, partly or not at all, and "
        "its result was not recorded. Only read-only or idempotent operations may be retried as "
        "they are. For anything with side effects, first check the real state to see what "
        "happened, or ask the user. Do not retry blindly."
    ),
    not_started_message="the session log could not be written, so this call was not started",
    not_started_content=(
        "Error: this tool call never started. andon could not write its session log, and a call "
        "is only started once its tool/call is on disk, so it did not run and changed nothing. "
        "It may be retried if it is still needed."
    ),
)


class _Syncer:
    """The one background thread that fsyncs the log, batching every request made meanwhile.

    Progress is counted in appended lines: ``written()`` is how many whole lines the writer has
    committed (never more than the file holds); a sync started after reading ``written() == n``
    covers the first ``n`` lines.
    """

    def __init__(self, fd: int, fsync: FsyncFn, name: str, written: Callable[[], int]) -> None:
        self._fd = fd
        self._fsync = fsync
        self._name = name
        self._cond = threading.Condition()
        self._written = written
        self._requested = 0
        self._synced = 0
        self._error: OSError | None = None
        self._stopping = False
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None

    async def wait(self, target: int) -> None:
        """Return once the first ``target`` lines are synced; raise the sync's ``OSError``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._synced >= target:
                return
            if self._stopping:
                raise RuntimeError("the session log is closed")
            self._waiters.append((target, loop, fut))
            self._requested = max(self._requested, target)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        await fut

    def covers(self, target: int) -> bool:
        """Whether the first ``target`` lines are synced already (no sync failed)."""
        with self._cond:
            return self._error is None and self._synced >= target

    def stop(self) -> None:
        """Finish the syncs already asked for, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and self._requested <= self._synced:
                    self._cond.wait()
                if self._requested <= self._synced:
                    return  # stopping and nothing owed
                target = self._written()  # >= every request made so far
            error: OSError | None = None
            try:
                self._fsync(self._fd)
            except OSError as exc:
                error = exc
            with self._cond:
                if error is not None:
                    self._error = error
                    done, self._waiters = self._waiters, []
                else:
                    self._synced = max(self._synced, target)
                    done = [w for w in self._waiters if w[0] <= self._synced]
                    self._waiters = [w for w in self._waiters if w[0] > self._synced]
            for _, loop, fut in done:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    loop.call_soon_threadsafe(_settle_future, fut, error)
            if error is not None:
                return


def _settle_future(fut: asyncio.Future[None], error: OSError | None) -> None:
    if fut.done():  # the waiter was cancelled
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


@dataclass(frozen=True, slots=True)
class _Mark:
    """What the writer knows of its file. Replaced whole, never changed in place (its tail is
    never fed once it is in a mark), so that committing an append is one attribute store."""

    end: int
    """Byte offset just past the last whole record: where a failure cuts back to."""
    lines: int
    """Whole records this writer appended: the sync thread's progress counter."""
    tail: Tail
    """The fold of every record up to ``end``."""


class SessionLog:
    """The append side of a session: holds the session lock from :meth:`open` to :meth:`close`.

    Appends are synchronous and assign ``seq`` and ``time``; call them from one thread at a time
    (the agent's event loop). The writer follows the open turn and step so that it can close them
    itself if the disk fails.
    """

    def __init__(
        self,
        *,
        folder: Path,
        lock: SessionLock,
        fd: int,
        tail: Tail,
        end: int,
        durability: Durability,
        clock: Clock,
        write: WriteFn,
        fsync: FsyncFn,
        loaded: LoadedSession,
        read_end: ReadEnd | None = None,
        probe: ProbeFn | None = None,
        unpublished: Path | None = None,
    ) -> None:
        self.session_dir = folder
        self.path = folder / LOG_NAME
        # A new session is written in a hidden temporary folder until its first barrier
        # (andon.session._create); ``_where`` is where the log is now.
        self._unpublished = unpublished
        self._where = (unpublished or folder) / LOG_NAME
        self.durability: Durability = durability
        self.loaded = loaded
        self._read_end = read_end or ReadEnd(0, 0, 0)
        self._lock = lock
        self._fd = fd
        self._mark = _Mark(end, 0, tail)
        # The marks of an append whose write may have begun: one per line, in order (one for a
        # single record, several for a batch).
        self._inflight: tuple[_Mark, ...] | None = None
        self._clock = clock
        self._write = write
        self._fsync = fsync
        self._probe = probe or _no_probe
        self._mutex = threading.RLock()
        self._failure: OSError | None = None
        self._gone: str | None = None  # "deleted" / "replaced": the log vanished under the writer
        self._closed = False
        self._syncer = _Syncer(fd, fsync, f"andon-fsync-{folder.name}", self._lines)

    @classmethod
    def open(
        cls,
        session_dir: str | os.PathLike[str],
        *,
        durability: Durability = "barrier",
        clock: Clock | None = None,
        write: WriteFn = os.write,
        fsync: FsyncFn = os.fsync,
        probe: ProbeFn | None = None,
        keep: Keep = "all",
    ) -> SessionLog:
        """Take the session lock and open the log for appending (creating folder and log).

        The folder is created 0700 and the log 0600. An existing log is loaded, and repaired if
        its last process died, under this same lock (nobody can slip in between); what was there
        is in :attr:`loaded` (every record, or with ``keep="history"`` only those a resumed
        agent needs, which a long log that compacts reads in time set by its compaction
        period). Raises ``SessionLive`` if another process holds the lock, and
        ``LogCorrupted`` / ``LogFormatUnsupported`` for a log that cannot be continued.

        A folder that does not exist yet is built under a hidden temporary name and appears under
        its own name when the first append returns, with that record synced (so a crash before
        that leaves no session, never a folder without a log); closed before, nothing is left.
        """
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {', '.join(_DURABILITIES)}")
        clock = clock or SystemClock()
        folder = Path(session_dir)
        unpublished: Path | None = None
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            unpublished = make_temporary(folder)
        try:
            lock = SessionLock.acquire(unpublished or folder)
        except BaseException:
            if unpublished is not None:
                remove_temporary(unpublished)
            raise
        try:
            path = (unpublished or folder) / LOG_NAME
            if path.exists() and path.stat().st_size > 0:
                repair_children(folder, clock=clock)  # subagents' logs close first
                outcome = repair_locked(folder, clock=clock, dry_run=False, keep=keep)
                tail, report = outcome.tail, outcome.report
                loaded = LoadedSession(
                    outcome.events,
                    report.repaired,
                    report.closers,
                    report,
                    outcome.state,
                    outcome.cut,
                )
                read_end = outcome.read_end
            else:
                read_end = ReadEnd(0, 0, 0)
                tail = Tail()
                empty = RepairReport(False, None, None, (), None, (), 0)
                loaded = LoadedSession([], False, (), empty, StateFold().result())
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                if created:
                    os.fchmod(fd, 0o600)
                if created and durability != "none":
                    # The new name must survive a machine crash too, not only its contents.
                    where = unpublished or folder
                    dir_fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    try:
                        with naming_file(where):
                            fsync(dir_fd)
                    finally:
                        os.close(dir_fd)
                end = os.fstat(fd).st_size
                # Built inside the try: an interrupt landing here must not leak the lock.
                return cls(
                    folder=folder,
                    lock=lock,
                    fd=fd,
                    tail=tail,
                    end=end,
                    durability=durability,
                    clock=clock,
                    write=write,
                    fsync=fsync,
                    loaded=loaded,
                    read_end=read_end,
                    probe=probe,
                    unpublished=unpublished,
                )
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            lock.release()
            if unpublished is not None:
                remove_temporary(unpublished)
            raise

    def records_from(self, seq: int) -> Iterator[Record]:
        """The log's records from ``seq`` on, read from the file (the records of this process
        and those before it alike). Where the open read the log up to ``seq`` or beyond, reading
        starts at the end of what it read rather than at the first line: a resumed session of
        a million records does not parse them all again to replay its last few."""
        end = self._read_end
        if seq >= end.seq:
            stream = RecordStream(
                log_path(self.session_dir),
                label=str(self.session_dir),
                start=end.offset,
                start_line=end.lines,
            )
        else:
            stream = iter_records(self.session_dir)
        with stream:
            for record in stream:
                if record.seq >= seq:
                    yield record

    # --- state ------------------------------------------------------------------------------

    def _current(self) -> Tail:
        if self._inflight is not None:  # an interrupted append: the file says what happened
            with self._mutex:
                self._settle()
        return self._mark.tail

    def _lines(self) -> int:
        return self._mark.lines

    @property
    def next_seq(self) -> int:
        """The seq the next append gets."""
        return self._current().next_seq

    @property
    def last_turn(self) -> int:
        """The highest turn number started so far (0 before the first turn)."""
        return self._current().last_turn

    @property
    def open_turn(self) -> int | None:
        return self._current().open_turn

    @property
    def open_step(self) -> tuple[int, int] | None:
        """``(turn, step)`` of the open step, if any."""
        step = self._current().step
        return None if step is None else (step.turn, step.step)

    @property
    def failed(self) -> bool:
        """Whether an append or sync failed; every later append raises ``LogWriteFailed``."""
        return self._failure is not None

    @property
    def closed(self) -> bool:
        return self._closed

    # --- appending --------------------------------------------------------------------------

    def append(self, data: EventData, *, ignorable: bool = False) -> Record:
        """Append one record and return it (with its seq and time) once the kernel has it.

        Raises ``LogWriteFailed`` if the write fails (or an earlier one did) and ``ValueError``
        for a record that cannot be written (NaN, invalid text; nothing is written then). If an
        asynchronous exception (``KeyboardInterrupt``) cuts it short, the record is either whole
        in the log and counted, or not in the log at all; :attr:`next_seq` says which.
        """
        return self._append((data,), ignorable=ignorable)[0]

    def append_many(self, datas: Sequence[EventData]) -> list[Record]:
        """Append several records as one batch: one ``write`` of all their lines and, in
        ``"every-record"`` mode, one ``fsync`` for the batch (docs/log-format.md, Durability).

        For many records at once (a stopped step's thousands of not-run results): the records
        are exactly those ``append`` would write one by one, in order, with consecutive seqs. A
        failure or an interrupt keeps the batch's whole lines that reached the file (they count,
        as whole single appends do) and cuts off a partial one, as for a single record.
        """
        if not datas:
            return []
        return self._append(tuple(datas), ignorable=False)

    def _append(self, datas: tuple[EventData, ...], *, ignorable: bool) -> list[Record]:
        with self._mutex:
            self._settle()  # an earlier append an interrupt cut short (normally nothing to do)
            if self._failure is not None:
                raise self._refusal() from self._failure
            if self._closed:
                raise SessionError("the session log is closed", session=str(self.session_dir))
            seq = self._mark.tail.next_seq
            records: list[Record] = []
            lines: list[bytes] = []
            for data in datas:
                if seq == 0 and not isinstance(data, SessionStart):
                    raise ValueError("the first record of a session must be session/start")
                if isinstance(data, Unrecognized) and not ignorable:
                    raise ValueError("a record of an unknown type can only be written as ignorable")
                record = Record(seq, self._clock.time(), data, None, ignorable)
                lines.append(encode_line(record))  # ValueError: none of the batch is written
                records.append(record)
                seq += 1
            try:
                self._append_records(records, lines, sync=self.durability == "every-record")
            except OSError as exc:
                self._fail(exc)
                raise self._refusal() from exc
            finally:
                # Something is in flight only if an asynchronous exception cut the append (or its
                # failure handling) short: mend it now, so that no partial line outlives append
                # even if nothing follows. A second interrupt in here is mended by the next call.
                self._settle()
            if self._unpublished is not None:
                self._publish(self._unpublished)
            return records

    def _append_records(self, records: list[Record], lines: list[bytes], *, sync: bool) -> None:
        """Write encoded records in one ``write`` (and ``fsync`` them if ``sync``), then commit
        them to the state. One record is the common case; several are a batch, whose lines are
        marked one by one so that a cut batch keeps exactly its whole lines.

        Atomic against asynchronous exceptions. A signal handler's exception surfaces between
        two bytecodes, so it can split the write syscall from its bookkeeping, and no Python code
        can prevent that (masking the signal in this thread does not stop another thread's
        delivery from interrupting this one). So the bookkeeping is made not to need protecting:

        * everything the append changes in memory is computed first, into new :class:`_Mark`
          values (one per line; ``after`` is the last); nothing shared is touched until
          ``_inflight = marks`` says a write may have begun;
        * the commit is the single store ``_mark = after``: an interrupt lands before it or after
          it, never inside;
        * between the two stores the file itself says how far the write got: this writer is the
          only one appending (the session lock; ``O_APPEND``), so the file is exactly
          ``before.end`` bytes (nothing written), a mark's ``end`` (its lines whole), or in
          between (part of a line). ``_reconcile`` reads that and commits or cuts back to the
          last whole line; it is idempotent, so
          an interrupt inside it is mended by running it again, which every entry point does.

        In ``"every-record"`` mode the fsync comes before the commit, so every committed record
        is synced; a whole line found uncommitted is synced by ``_reconcile`` before it counts.
        """
        before = self._mark
        marks: list[_Mark] = []
        mark = before
        for record, line in zip(records, lines, strict=True):
            mark = _Mark(mark.end + len(line), mark.lines + 1, mark.tail.fed(record))
            marks.append(mark)
        after = mark
        self._probe("prepared")
        self._inflight = tuple(marks)
        self._probe("in-flight")
        self._write_line(lines[0] if len(lines) == 1 else b"".join(lines))
        self._probe("written")
        if sync:
            self._fsync(self._fd)
            self._probe("synced")
        self._mark = after  # the commit point
        self._probe("committed")
        self._inflight = None
        self._probe("settled")

    def _write_line(self, line: bytes) -> None:
        # Normally exactly one write. A short write only happens at a limit (disk full, file size
        # limit); writing the rest then either completes the line or raises the real error. Any
        # exception ends the loop, so no byte is ever written twice.
        written = self._write(self._fd, line)
        while written < len(line):
            if written <= 0:
                raise OSError(errno.EIO, "the write made no progress")
            self._probe("partly-written")
            written += self._write(self._fd, line[written:])

    def _reconcile(self, *, sync: bool) -> None:
        """Make the state agree with the file after an append that did not finish.

        A whole line stands (the kernel has it; a reader may have seen it) and is committed,
        synced first if ``sync``; part of a line was never acknowledged and is cut off (in a
        batch, the lines before it stand). Raises
        ``OSError`` if the file cannot be read, cut or synced, or has a size no append of ours
        explains. Idempotent (see ``_append_records``).
        """
        marks = self._inflight
        if marks is None:
            return
        before = self._mark
        if before is not marks[-1]:
            size = os.fstat(self._fd).st_size
            self._probe("reconcile-sized")
            if not before.end <= size <= marks[-1].end:
                raise OSError(
                    errno.EIO,
                    f"the log is {size} bytes where this writer expected {before.end} to "
                    f"{marks[-1].end}: something else changed it",
                )
            # The last whole line in the file (``before`` if none of the batch's is whole).
            whole = before
            for mark in marks:
                if mark.end > size:
                    break
                whole = mark
            if whole.end < size:
                os.ftruncate(self._fd, whole.end)
                self._probe("reconcile-cut")
            if whole is not before:
                if sync:
                    self._fsync(self._fd)
                self._mark = whole
                self._probe("reconcile-committed")
        self._inflight = None

    def _settle(self) -> None:
        """Finish an append that an asynchronous exception cut short, if there is one."""
        if self._inflight is None:
            return
        try:
            self._reconcile(sync=self.durability == "every-record")
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        """Record the failure, cut off any partial line, and close the open step and turn once."""
        if self._failure is not None:
            return
        self._failure = exc
        try:
            # The failed append's line, if any: kept if whole (then its fsync is what failed),
            # cut off if not.
            self._reconcile(sync=False)
        except OSError:
            # Cannot tell where the log ends, or cannot remove the partial line: appending closers
            # after it would turn a torn tail (which load repairs) into corruption (which load
            # refuses). Stop here.
            return
        reason = TurnFailed(
            f"writing the session log failed: {exc.strerror or exc}",
            ErrorCode.LOG_WRITE_FAILED.value,
        )
        for data in closing_data(self._mark.tail, reason, WRITE_FAILURE_TEXTS):
            record = Record(self._mark.tail.next_seq, self._clock.time(), data)
            try:
                self._append_records([record], [encode_line(record)], sync=False)
            except OSError:
                with contextlib.suppress(OSError):
                    self._reconcile(sync=False)
                return  # tried once; crash repair closes the rest on the next load
        if self.durability != "none":
            with contextlib.suppress(OSError):
                self._fsync(self._fd)

    def _refusal(self) -> LogWriteFailed:
        exc = self._failure
        assert exc is not None
        if self._gone == "taken":
            return LogWriteFailed(
                f"the session folder {self.session_dir} was created by another process while this "
                "one was creating it; this writer holds no session",
                session=str(self.session_dir),
                errno=exc.errno,
            )
        if self._gone is not None:
            return LogWriteFailed(
                f"the session log {self.path} was {self._gone} while the session ran (a tool's "
                "'git clean -fdx' or 'rm -rf'?); andon stopped writing, so this run's records "
                "after that are lost. Keep sessions outside the workspace (the default root, or "
                "ANDON_HOME) so that the tools cannot reach them.",
                session=str(self.session_dir),
                errno=exc.errno,
            )
        return LogWriteFailed(
            f"writing the session log {self.path} failed ({exc.strerror or exc}); andon stopped "
            "writing to it and closed the open turn where it could. Free space or fix the disk, "
            "then resume the session: the log loads, and repair closes whatever is still open.",
            session=str(self.session_dir),
            errno=exc.errno,
        )

    # --- syncing ----------------------------------------------------------------------------

    async def barrier(self) -> None:
        """Return once everything appended so far is synced to disk (``"barrier"`` mode).

        In ``"every-record"`` mode everything already is; in ``"none"`` mode nothing is waited
        for. Raises ``LogWriteFailed`` if the sync (or an earlier append) failed.
        """
        if self._inflight is not None:
            with self._mutex:
                self._settle()
        if self._failure is not None:
            raise self._refusal() from self._failure
        if self._closed:
            return
        self._check_file()
        if self.durability == "barrier":
            try:
                await self._syncer.wait(self._mark.lines)
            except OSError as exc:
                with self._mutex:
                    self._fail(exc)
                raise self._refusal() from exc
        if self._unpublished is not None:  # an interrupt cut the first append's publish short
            with self._mutex:
                self._publish(self._unpublished)

    def _publish(self, work: Path) -> None:
        """Give a new session its name once its first record is durable (synced here, once per
        session, before the rename: the name must never survive a machine crash without it)."""
        if self._mark.lines == 0:
            return
        try:
            if self.durability == "barrier":  # "every-record" has synced it already
                self._fsync(self._fd)
            publish(work, self.session_dir, sync=self.durability != "none")
        except FileExistsError as exc:
            # Another process created the session while this one was opening it: it is that
            # process's session (live, as a lock would say), and this one never existed; its
            # hidden folder goes at close.
            self._gone = "taken"
            self._failure = exc
            raise SessionLive(
                f"session {self.session_dir} was created by another process while this one was "
                "creating it (another andon with the same --session?); nothing of this run was "
                "kept",
                session=str(self.session_dir),
                pid=None,
                host=None,
            ) from None
        except OSError as exc:
            with self._mutex:
                self._fail(exc)
            raise self._refusal() from exc
        self._unpublished = None
        self._where = self.path

    def _check_file(self) -> None:
        """Fail (``LogWriteFailed``) if the log was deleted or replaced under this writer: the
        open file has no name left (``st_nlink == 0``), or the path names another file (another
        inode or device), or none. One ``fstat`` and one ``stat``; run at every barrier, not at
        every append."""
        try:
            mine = os.fstat(self._fd)
            try:
                named = os.stat(self._where)
            except FileNotFoundError:
                gone: str | None = "deleted"  # or moved away, or its folder removed
            else:
                same = (named.st_ino, named.st_dev) == (mine.st_ino, mine.st_dev)
                # The same file under its name always has a link (st_nlink == 0 means unlinked).
                gone = None if same and mine.st_nlink > 0 else "replaced"
        except OSError as exc:
            with self._mutex:
                self._fail(exc)
            raise self._refusal() from exc
        if gone is None:
            return
        with self._mutex:
            if self._failure is None:
                self._gone = gone
                self._fail(OSError(errno.ESTALE, f"the session log was {gone}"))
        raise self._refusal() from self._failure

    def close(self) -> None:
        """Sync (unless ``"none"``), stop the sync thread, close the file and release the lock.

        Idempotent. Raises ``LogWriteFailed`` if the final sync fails (everything is closed
        anyway).
        """
        with self._mutex:
            if self._closed:
                return
            self._settle()  # no partial line of an interrupted append outlives the writer
            self._closed = True
        error: OSError | None = None
        try:
            self._syncer.stop()
            # Every line may be durable already: in "every-record" mode each append synced, and
            # in "barrier" mode the last barrier (the turn's end, on a run's way out) may cover
            # them all. A second fsync of the same bytes would only delay the exit.
            owed = self.durability == "barrier" and not self._syncer.covers(self._mark.lines)
            if owed and self._failure is None:
                try:
                    self._fsync(self._fd)
                except OSError as exc:
                    error = exc
                    self._failure = exc
            if self._unpublished is not None and self._mark.lines > 0 and self._gone != "taken":
                # An interrupt cut the first append's publish short: the log still gets its name.
                with contextlib.suppress(OSError):
                    publish(self._unpublished, self.session_dir, sync=self.durability != "none")
                    self._unpublished = None
        finally:
            try:
                os.close(self._fd)
            finally:
                self._lock.release()
                never_a_session = self._mark.lines == 0 or self._gone == "taken"
                if self._unpublished is not None and never_a_session:
                    # Never written, or its name was taken by another process: leave nothing.
                    remove_temporary(self._unpublished)
        if error is not None:
            raise self._refusal() from error

    async def aclose(self) -> None:
        """Close without blocking the event loop on the final sync (it runs in the sync thread)."""
        if not self._closed and self._failure is None:
            with contextlib.suppress(LogWriteFailed):
                await self.barrier()
        self.close()

    def __enter__(self) -> SessionLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> SessionLog:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "failed" if self._failure else "closed" if self._closed else "open"
        return f"<SessionLog {self.path} {state} next_seq={self.next_seq}>"
