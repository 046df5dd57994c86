"""Cold load and crash repair (docs/log-format.md, Crash repair).

A process that dies by kill -9 runs no ``finally``: its log can end inside a turn, inside a step,
with tool calls that have no result, and with half a line. Repair makes such a log balanced again
by **appending** closers; history is never deleted or rewritten (the bytes of a torn tail are moved
to a file beside the log, not thrown away). In order:

1. take the session lock: a live session is refused (``SessionLive`` names the holder), because
   its open turn is simply still running;
2. read the log; corruption in the middle or an unknown format refuses the load and changes
   nothing;
3. a torn tail is copied to ``events.jsonl.torn-<offset>`` (and synced) **before** the log is cut
   back to its last whole record;
4. leftover processes of calls that had started are killed **before** their results are written;
5. closers (see ``_tail``): results for dangling calls in model order, ``step/end``, ``turn/end``
   ``{"kind": "interrupted"}``, each marked ``"synthetic": "repair"``; then ``session/repaired``;
6. fsync, and release the lock before returning.

Each step leaves a log that a later repair completes: if repair itself is killed half way, the next
load sees a log that still does not balance (or a torn tail it has already saved, byte for byte
the same) and carries on. A balanced log is left exactly as it is: ``load`` of it writes nothing
to it (of a long log it may leave the index beside it: ``_index``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, final

from andon.base import Clock, SessionError, SystemClock, naming_file
from andon.session._create import is_temporary
from andon.session._folds import SessionState
from andon.session._index import Reading
from andon.session._leftovers import Leftover, kill_leftovers, plan_for
from andon.session._lock import SessionLock
from andon.session._reader import RecordStream, TornTail, log_path
from andon.session._records import Record, SessionRepaired, encode_line
from andon.session._tail import ClosingTexts, Tail, closing_data
from andon.session._values import Interrupted

__all__ = ["REPAIR_TEXTS", "LoadedSession", "RepairReport", "kill_in_flight", "load", "repair"]

REPAIR_TEXTS = ClosingTexts(
    error_name="HarnessStopped",
    unknown_message="the harness stopped while this tool call was running; its outcome is unknown",
    unknown_content=(
        "Error: the outcome of this tool call is unknown. The harness (andon) stopped while the "
        "call was running, so it may have run fully, partly or not at all, and its output was "
        "lost. Only read-only or idempotent operations may be retried as they are. For anything "
        "with side effects (writing files, installing, deploying, sending), first check the real "
        "state to see what happened, or ask the user. Do not retry blindly."
    ),
    not_started_message="the harness stopped before this tool call was sent to a worker",
    not_started_content=(
        "Error: this tool call never started. The harness (andon) stopped before the call was "
        "sent to a worker, so it did not run and changed nothing. It may be retried if it is "
        "still needed."
    ),
)


@final
@dataclass(frozen=True, slots=True)
class RepairReport:
    """What repair did, or (``dry_run``) would do.

    ``closers`` are the records appended to close the log (results, ``step/end``, ``turn/end``);
    ``summary`` is the ``session/repaired`` record after them. ``leftovers`` are the processes found
    (and, unless ``dry_run``, killed). In a dry run the records carry the seq they would get.
    """

    dry_run: bool
    torn: TornTail | None
    torn_file: str | None
    closers: tuple[Record, ...]
    summary: Record | None
    leftovers: tuple[Leftover, ...]
    killed_leftovers: int

    @property
    def appended(self) -> tuple[Record, ...]:
        """Every record repair appended (would append), in order."""
        return (*self.closers, self.summary) if self.summary is not None else self.closers

    @property
    def repaired(self) -> bool:
        """Whether the log needed repair (a torn tail, or anything left open)."""
        return self.torn is not None or bool(self.closers)


@final
@dataclass(frozen=True, slots=True)
class LoadedSession:
    """A cold session, repaired if it needed it.

    ``events`` are all records, the appended ones included (or, opened with ``keep="history"``,
    those a resumed agent needs: ``andon.session._history_start``); ``repaired`` says whether
    anything was done; ``closers`` are the closing records repair appended (before its
    ``session/repaired``); ``state`` is ``fold_state`` of the whole log, closers included;
    ``cut`` is the ``seq`` the history part starts from (None: ``events`` are every record).
    """

    events: list[Record]
    repaired: bool
    closers: tuple[Record, ...]
    report: RepairReport
    state: SessionState
    cut: int | None = None


@dataclass(frozen=True, slots=True)
class ReadEnd:
    """A place in a log: the record ``seq`` starts at byte ``offset``, after ``lines`` lines."""

    seq: int
    offset: int
    lines: int


@dataclass(slots=True)
class _Outcome:
    events: list[Record]
    tail: Tail
    report: RepairReport
    read_end: ReadEnd
    """Where the records read end (before anything repair appended)."""
    state: SessionState
    cut: int | None


def _torn_target(log: Path, torn: TornTail, data: bytes) -> tuple[Path, bool]:
    """Where to save a torn tail, and whether an earlier, interrupted repair already saved it."""
    base = log.parent / f"{log.name}.torn-{torn.offset}"
    candidate, n = base, 0
    while candidate.exists():
        with contextlib.suppress(OSError):
            if candidate.read_bytes() == data:
                return candidate, True
        n += 1  # different bytes under the same name: never overwrite, pick the next name
        candidate = base.with_name(f"{base.name}.{n}")
    return candidate, False


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with naming_file(folder):
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _append_whole_lines(log: Path, records: list[Record]) -> None:
    """Append ``records`` one write per line, as the live writer does, then fsync.

    Repair killed half way leaves whole records (or a torn last line the next load saves) and
    nothing worse. Repair *interrupted* (an exception: ``KeyboardInterrupt``, a full disk) does
    better: it cuts its own partial line off on the way out, so that the next load does not take
    it for a crash's torn write, save it and count it in ``session/repaired``. Where the line
    boundaries are is known before the first write, and the file size (we hold the lock and
    append alone) says which one the writes reached, however the exception split them from
    their bookkeeping.
    """
    lines = [encode_line(record) for record in records]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        start = os.fstat(fd).st_size
        try:
            with naming_file(log):  # a full disk names the log
                for line in lines:
                    _write_all(fd, line)
                os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # then the next load saves it as a torn tail
                size = os.fstat(fd).st_size
                whole = start
                for line in lines:
                    if whole + len(line) > size:
                        break
                    whole += len(line)
                if size != whole:
                    os.ftruncate(fd, whole)
            raise
    finally:
        os.close(fd)


def _save_torn_tail(log: Path, torn: TornTail) -> str:
    """Copy the torn bytes beside the log, durably, then cut the log back. Returns the file name."""
    with open(log, "rb") as f:
        f.seek(torn.offset)
        data = f.read()
    target, saved = _torn_target(log, torn, data)
    if not saved:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with naming_file(target):
                _write_all(fd, data)
                os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(log.parent)
    # Only now that the bytes are safe elsewhere may the log lose them.
    fd = os.open(log, os.O_WRONLY | os.O_CLOEXEC)
    try:
        with naming_file(log):
            os.ftruncate(fd, torn.offset)
            os.fsync(fd)
    finally:
        os.close(fd)
    return target.name


Keep = Literal["none", "all", "history"]
"""What :func:`repair_locked` returns of the records: none, all of them, or those a resumed
agent needs (``session/start``, the first user message and everything from the last
compaction's cut on: ``andon.session._history_start``)."""


def repair_locked(folder: Path, *, clock: Clock, dry_run: bool, keep: Keep) -> _Outcome:
    """Read and (unless ``dry_run``) repair a session whose lock the caller holds."""
    log = log_path(folder)
    # The index spares folding (and, unless every record is wanted, reading) what it covers
    # (docs/log-format.md, The index of a long log). A long read leaves one for the next.
    reading = Reading(folder, label=str(folder))
    tail = reading.scan.tail
    history = reading.scan.history
    events: list[Record] = []
    if keep == "all" and reading.from_offset:
        events.extend(_covered(reading))
    cut = history.cut
    for record in reading.records():
        if keep == "all":
            events.append(record)
        elif keep == "history":
            if history.cut is not cut:  # a compaction moved the start: drop what it replaced
                cut = history.cut
                events = [r for r in events if history.keeps(r)]
            events.append(record)
    if keep == "history":
        streamed = {r.seq for r in events}
        events = [r for r in _history_head(reading) if r.seq not in streamed] + events
    torn = reading.stream.torn
    read_end = ReadEnd(tail.next_seq, reading.stream.end_offset, reading.stream.lines)

    # Nothing to close in a log that has no complete record (a crash during the very first append):
    # a session/repaired there would break "the first record is session/start".
    closing = closing_data(tail, Interrupted(), REPAIR_TEXTS) if tail.next_seq else []
    plan = plan_for(tail)

    if torn is None and not closing:
        report = RepairReport(dry_run, None, None, (), None, (), 0)
        if not dry_run:
            reading.save()
        return _outcome(reading, keep, events, report, read_end)

    if dry_run:
        torn_file = None if torn is None else f"{log.name}.torn-{torn.offset}"
        killed = len(plan.processes)
    else:
        torn_file = None if torn is None else _save_torn_tail(log, torn)
        killed = kill_leftovers(plan)

    now = max(clock.time(), tail.last_time)
    closers: list[Record] = []
    summary: Record | None = None
    seq = tail.next_seq
    for data in closing:
        closers.append(Record(seq, now, data, "repair"))
        seq += 1
    if tail.next_seq:
        summary = Record(
            seq,
            now,
            SessionRepaired(0 if torn is None else torn.length, torn_file, len(closers), killed),
            "repair",
        )
    appended = [*closers, summary] if summary is not None else closers
    if not dry_run and appended:
        _append_whole_lines(log, appended)
    if dry_run:
        for record in appended:
            tail.feed(record)
    else:
        reading.extend(appended)  # feeds the tail too
        reading.save()
    if keep != "none":
        events.extend(appended)
    report = RepairReport(dry_run, torn, torn_file, tuple(closers), summary, plan.processes, killed)
    return _outcome(reading, keep, events, report, read_end)


def _covered(reading: Reading) -> list[Record]:
    """The records the verified index covers, parsed for a caller that wants them all (the
    index's state already holds what they fold to, so they are not folded again)."""
    return _up_to_index(reading, 0, 0)


def _up_to_index(reading: Reading, start: int, line: int) -> list[Record]:
    """The records from byte ``start`` (after ``line`` lines) to where the index ends, which the
    stream did not read."""
    out: list[Record] = []
    if start >= reading.from_offset:
        return out
    with RecordStream(reading.log, label=str(reading.folder), start=start, start_line=line) as head:
        for record in head:
            out.append(record)
            if head.end_offset >= reading.from_offset:
                break
    if head.end_offset != reading.from_offset:  # cannot be: the bytes hashed the same
        raise SessionError(f"{reading.log} changed while it was read", session=str(reading.folder))
    return out


def _outcome(
    reading: Reading, keep: Keep, events: list[Record], report: RepairReport, read_end: ReadEnd
) -> _Outcome:
    cut = reading.scan.history.cut if keep == "history" else None
    return _Outcome(
        events,
        reading.scan.tail,
        report,
        read_end,
        reading.scan.state.result(),
        None if cut is None else cut.seq,
    )


def _history_head(reading: Reading) -> list[Record]:
    """The records a resumed agent needs from before where the stream started (the index's
    offset): ``session/start``, the first user message, and the log from the cut to that
    offset; the ones the stream itself read are not repeated."""
    history = reading.scan.history
    cut = history.cut
    start, line = (cut.offset, cut.line) if cut is not None else (0, 0)
    before = [r for r in (reading.scan.first, history.first_user) if r is not None]
    out = [r for r in before if cut is not None and r.seq < cut.seq]
    return out + _up_to_index(reading, start, line)


def _locked(session_dir: str | os.PathLike[str]) -> tuple[Path, SessionLock]:
    folder = Path(session_dir)
    if not folder.is_dir():
        raise SessionError(f"{folder} is not a session folder", session=str(folder))
    return folder, SessionLock.acquire(folder)


def load(session_dir: str | os.PathLike[str], *, clock: Clock | None = None) -> LoadedSession:
    """Cold-load a session, repairing it if its last process died without closing it.

    Raises ``SessionLive`` (naming the holder's pid) if another process holds the session lock,
    ``LogCorrupted`` for a bad line in the middle of the log and ``LogFormatUnsupported`` for a
    log this version cannot read; in all three cases nothing on disk is changed. The lock is
    released before returning. Loading a balanced log writes nothing to it.
    """
    folder, lock = _locked(session_dir)
    try:
        repair_children(folder, clock=clock)
        outcome = repair_locked(folder, clock=clock or SystemClock(), dry_run=False, keep="all")
    finally:
        lock.release()
    report = outcome.report
    return LoadedSession(outcome.events, report.repaired, report.closers, report, outcome.state)


def repair_children(folder: Path, *, clock: Clock | None = None) -> None:
    """Repair the sessions of subagents (``subagents/<call_id>/``) before their parent's.

    A child's process is the parent's, so a crash leaves both open; the child is closed first so
    that, by the time the parent's dangling call is answered, the child's log already says how it
    ended. Children are repaired recursively (a child may have children of its own).
    """
    children = folder / "subagents"
    if not children.is_dir():
        return
    for child in sorted(children.iterdir()):
        if not is_temporary(child.name) and log_path(child).is_file():
            # As load() does, without keeping the child's records (nobody reads them here):
            # the child's index, if it has one, spares reading its log.
            folder, lock = _locked(child)
            try:
                repair_children(folder, clock=clock)
                repair_locked(folder, clock=clock or SystemClock(), dry_run=False, keep="none")
            finally:
                lock.release()


def repair(
    session_dir: str | os.PathLike[str], *, dry_run: bool = False, clock: Clock | None = None
) -> RepairReport:
    """Repair a cold session and say what was appended (``andon repair``).

    With ``dry_run=True`` nothing is written, moved or killed: the report lists the records that
    would be appended (with the seq they would get) and the leftover processes that would be
    killed. The lock is taken either way, so a live session is refused in both modes.
    """
    folder, lock = _locked(session_dir)
    try:
        outcome = repair_locked(folder, clock=clock or SystemClock(), dry_run=dry_run, keep="none")
    finally:
        lock.release()
    return outcome.report


def kill_in_flight(records: Iterable[Record], *, wait: float = 0.0) -> int:
    """SIGKILL the processes of the calls ``records`` (a live session's log so far) leave
    started and unanswered, found exactly as repair finds them; return how many were killed.

    For a supervisor that must exit at once (``andon run``'s third Ctrl-C): nothing is written,
    and the next load repairs the log.
    """
    tail = Tail()
    for record in records:
        tail.feed(record)
    return kill_leftovers(plan_for(tail), wait=wait)
