"""A verified cache beside a long log (docs/log-format.md, The index of a long log).

Reading a log is linear: every line is decoded and typed, some 20 µs a record, so a log of 10^6
records takes 20 s to check or resume. What ``andon check``, ``repair`` and ``resume`` derive from
it is small (the invariant checker's state, what is open at the end, the inbox, the model and
prompt in force, the last consumed work). The index, ``events.index``, keeps exactly that, as of
some byte offset of the log, together with a SHA-256 of the log's bytes up to that offset.

The log stays the only truth; the index is never trusted blindly. Before it is used:

* its own bytes must match the hash in its first line (a damaged or cut index is refused);
* its version must be this one (a state this version cannot read is refused);
* the log must still hold the bytes it covers, and their SHA-256 must be the one it names: the
  prefix is streamed through ``hashlib`` in 1 MiB blocks (C speed, about 1 GB/s, flat memory).
  A log cut back, edited, replaced, or another session's log fails here.

Only then is the state restored, and only the log after the offset is read. Anything wrong is a
debug line (``andon.session``), never an error: the full read is done instead, and the index is
written again. The index is never a log record, is written to a temporary file that is renamed
over the old one (readers see the old or the new one, whole), and a failure to write it is
ignored: it is a cache.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from andon.session._check import InvariantViolation, _Checker
from andon.session._folds import ConsumedFold, ConsumedWork, SessionState, StateFold
from andon.session._history_start import HistoryStart
from andon.session._reader import LOG_NAME, RecordStream, TornTail
from andon.session._records import Record, TurnEnd, TurnStart, encode_line
from andon.session._tail import Tail
from andon.session._values import TurnFailed

__all__ = [
    "INDEX_MIN_BYTES",
    "INDEX_NAME",
    "INDEX_VERSION",
    "LogSummary",
    "Reading",
    "Scan",
    "summarize",
]

INDEX_NAME: Final = "events.index"
INDEX_VERSION: Final = 3
"""Bumped whenever what the index holds changes shape: an index of another version is ignored."""
INDEX_MIN_BYTES: Final = 1 << 20
"""A read that had to parse at least this many bytes of log leaves an index (about 6,000
records, 0.1 s of parsing): a short session gets no extra file, a long one gets one."""
_MAX_INDEX_BYTES: Final = 256 << 20
"""An index larger than this is not read (it cannot be one of ours for any log we can read)."""
_BLOCK: Final = 1 << 20
_MAX_VIOLATIONS: Final = 10_000
"""A log broken in more places than this gets no index: its check state would be large."""

_log = logging.getLogger("andon.session")


class Scan:
    """Everything a cold reader derives from a log, fed one record at a time.

    ``tail`` is what repair closes; ``checker`` what ``check`` reports; ``state`` and
    ``consumed`` what ``fold_state`` and ``fold_consumed_work`` return; ``records`` how many
    records there are; ``first`` the first record; ``overflowed`` whether the last turn ended
    because a request did not fit the model's window; ``history`` where the model-visible
    history starts (what a resumed agent reads).
    """

    __slots__ = (
        "checker",
        "consumed",
        "first",
        "history",
        "overflowed",
        "records",
        "state",
        "tail",
    )

    def __init__(self) -> None:
        self.tail = Tail()
        self.checker = _Checker(live=False)
        self.state = StateFold()
        self.consumed = ConsumedFold()
        self.records = 0
        self.first: Record | None = None
        self.overflowed = False
        self.history = HistoryStart()

    def feed(self, record: Record, offset: int, line: int) -> None:
        """One record, whose line starts at byte ``offset`` of the log after ``line`` lines."""
        self.tail.feed(record)
        self.checker.feed(record)
        self.state.feed(record)
        self.consumed.feed(record)
        self.history.feed(record, offset, line)
        if self.first is None:
            self.first = record
        self.records += 1
        match record.data:
            case TurnStart():
                self.overflowed = False
            case TurnEnd(reason=reason):
                self.overflowed = isinstance(reason, TurnFailed) and reason.code == (
                    "CONTEXT_OVERFLOW"
                )
            case _:
                pass

    def to_json(self) -> dict[str, Any]:
        return {
            "tail": self.tail.to_json(),
            "check": self.checker.to_json(),
            "state": self.state.to_json(),
            "consumed": self.consumed.to_json(),
            "records": self.records,
            "first": None if self.first is None else self.first.to_dict(),
            "overflowed": self.overflowed,
            "history": self.history.to_json(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Scan:
        scan = cls()
        scan.tail = Tail.from_json(obj["tail"])
        scan.checker = _Checker.from_json(obj["check"])
        scan.state = StateFold.from_json(obj["state"])
        scan.consumed = ConsumedFold.from_json(obj["consumed"])
        records, first, overflowed = obj["records"], obj["first"], obj["overflowed"]
        if not isinstance(records, int) or not isinstance(overflowed, bool):
            raise TypeError("records or overflowed has the wrong type")
        scan.records, scan.overflowed = records, overflowed
        scan.first = None if first is None else Record.from_dict(first)
        scan.history = HistoryStart.from_json(obj["history"])
        return scan


@dataclass(slots=True)
class _Start:
    """A verified index: the state it holds, where it ends, and the hash of the bytes before."""

    scan: Scan
    offset: int
    lines: int
    digest: Any  # a hashlib object that has taken the log's first ``offset`` bytes


class Reading:
    """One read of a session folder's log, from its index where a valid one is there.

    Iterate :attr:`stream` (or call :meth:`run`) and feed each record to :attr:`scan`; records
    appended afterwards by the reader itself (repair's closers) go through :meth:`extend`;
    :meth:`save` then leaves an index covering everything read, if the read was long.
    """

    def __init__(self, folder: Path, *, label: str, use_index: bool = True) -> None:
        self.folder = folder
        self.log = folder / LOG_NAME
        self.rejected = False
        """Whether an index was there but could not be used."""
        start = _verified(folder, self.log) if use_index else None
        if start is None:
            self.rejected = use_index and (folder / INDEX_NAME).exists()
            start = _Start(Scan(), 0, 0, hashlib.sha256())
        self.scan = start.scan
        self.indexed = start.offset > 0
        """Whether the read started from an index (only the log after it was parsed)."""
        self.from_offset = start.offset
        self._digest = start.digest
        self.stream = RecordStream(
            self.log, label=label, start=start.offset, start_line=start.lines, digest=self._digest
        )
        self._extra = 0  # bytes appended by the reader itself after the stream's end
        self._extra_lines = 0

    def run(self) -> None:
        for _ in self.records():
            pass

    def records(self) -> Iterator[Record]:
        """The records after the index (all of them without one), each fed to :attr:`scan`."""
        stream = self.stream
        offset, line = stream.end_offset, stream.lines
        for record in stream:
            self.scan.feed(record, offset, line)
            yield record
            offset, line = stream.end_offset, stream.lines

    def extend(self, records: Iterable[Record]) -> None:
        """Records the reader appended after the stream's end (whole lines, in order)."""
        for record in records:
            line = encode_line(record)
            offset = self.stream.end_offset + self._extra
            self.scan.feed(record, offset, self.stream.lines + self._extra_lines)
            self._digest.update(line)
            self._extra += len(line)
            self._extra_lines += 1

    @property
    def parsed(self) -> int:
        """How many bytes of log this read parsed (the rest the index covered)."""
        return self.stream.end_offset - self.from_offset

    def save(self) -> None:
        """Leave an index covering every whole record read, if this read was long (or an index
        that was there was refused). Never raises: a failure is a debug line."""
        if self.parsed < INDEX_MIN_BYTES and not self.rejected:
            return
        if len(self.scan.checker.out) > _MAX_VIOLATIONS:
            return
        try:
            body = {
                "log": {
                    "bytes": self.stream.end_offset + self._extra,
                    "lines": self.stream.lines + self._extra_lines,
                    "sha256": self._digest.hexdigest(),
                },
                "scan": self.scan.to_json(),
            }
            _write(self.folder, body)
        except Exception as exc:  # a cache: never an error for the user
            _log.debug("%s: the log's index was not written: %s", self.folder, exc)


def _write(folder: Path, body: dict[str, Any]) -> None:
    """Write the index atomically: a temporary file in the same folder, renamed over the old."""
    text = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"
    header = json.dumps(
        {"andon_index": INDEX_VERSION, "sha256": hashlib.sha256(text).hexdigest()},
        separators=(",", ":"),
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{INDEX_NAME}-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.encode("ascii") + b"\n")
            f.write(text)
        # No fsync: an index a machine crash leaves half written fails its own hash and is
        # ignored, so the cache costs the stop path nothing.
        os.replace(tmp, folder / INDEX_NAME)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _verified(folder: Path, log: Path) -> _Start | None:
    """The index of ``folder``, if it is there and matches the log; else None (and why, at
    debug level)."""
    path = folder / INDEX_NAME
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > _MAX_INDEX_BYTES:
                raise _Refused("it is larger than any index andon writes")
            header_line = f.readline(4096)
            text = f.read()
    except FileNotFoundError:
        return None
    except _Refused as exc:
        _log.debug("%s: the log's index is ignored: %s", folder, exc)
        return None
    except OSError as exc:
        _log.debug("%s: the log's index is ignored: it cannot be read: %s", folder, exc)
        return None
    try:
        return _check(header_line, text, log)
    except _Refused as exc:
        _log.debug("%s: the log's index is ignored: %s", folder, exc)
    except Exception as exc:  # anything a damaged file can make json or a from_json raise
        _log.debug("%s: the log's index is ignored: it is not readable (%r)", folder, exc)
    return None


class _Refused(Exception):
    """Why an index is not used."""


def _check(header_line: bytes, text: bytes, log: Path) -> _Start:
    header = json.loads(header_line)
    if not isinstance(header, dict) or "andon_index" not in header:
        raise _Refused("it is not an andon index")
    if header["andon_index"] != INDEX_VERSION:
        raise _Refused(f"it is version {header['andon_index']!r}, not {INDEX_VERSION}")
    if hashlib.sha256(text).hexdigest() != header.get("sha256"):
        raise _Refused("its contents do not match its own hash (damaged or cut)")
    body = json.loads(text)
    covered = body["log"]
    size, lines, want = covered["bytes"], covered["lines"], covered["sha256"]
    if not isinstance(size, int) or not isinstance(lines, int) or not isinstance(want, str):
        raise _Refused("it does not say what it covers")
    digest = hashlib.sha256()
    with open(log, "rb") as f:
        have = os.fstat(f.fileno()).st_size
        if have < size:
            raise _Refused(f"it covers {size} bytes, but the log has {have} (stale)")
        block = bytearray(_BLOCK)
        view = memoryview(block)
        left = size
        while left:
            n = f.readinto(view[: min(left, _BLOCK)])
            if not n:
                raise _Refused("the log ended while it was being hashed")
            digest.update(view[:n])
            left -= n
    if digest.hexdigest() != want:
        raise _Refused("the log's bytes it covers do not match its hash (changed, or another log)")
    return _Start(Scan.from_json(body["scan"]), size, lines, digest)


@dataclass(frozen=True, slots=True)
class LogSummary:
    """What ``andon check`` and ``andon resume`` need of a log, read without holding it.

    ``violations`` are those ``check`` reports for the log as it is (cold: an open turn at the
    end is one); ``indexed`` says whether an index spared reading most of the log.
    """

    records: int
    torn: TornTail | None
    violations: tuple[InvariantViolation, ...]
    state: SessionState
    consumed: ConsumedWork
    first: Record | None
    overflowed: bool
    indexed: bool
    _checker: _Checker = field(repr=False, compare=False)

    def check_with(self, records: Iterable[Record]) -> list[InvariantViolation]:
        """The violations of the log with ``records`` after it (what repair would append)."""
        checker = copy.deepcopy(self._checker)
        for record in records:
            checker.feed(record)
        return checker.finish()


def summarize(session: str | os.PathLike[str], *, use_index: bool = True) -> LogSummary:
    """Read a session folder's log once, from its index where a valid one is there, and leave an
    index for the next read if this one was long. No lock, no repair; ``LogCorrupted`` and
    ``LogFormatUnsupported`` as for :func:`read`."""
    folder = Path(session)
    reading = Reading(folder, label=str(folder), use_index=use_index)
    reading.run()
    if use_index:
        reading.save()
    scan = reading.scan
    return LogSummary(
        scan.records,
        reading.stream.torn,
        tuple(scan.checker.finish()),
        scan.state.result(),
        scan.consumed.result(),
        scan.first,
        scan.overflowed,
        reading.indexed,
        scan.checker,
    )
