"""Reading a log: streaming, without locking and without repairing.

Two kinds of bad line, told apart by where they are:

* the **last** line not ``\\n``-terminated, or not parsable as a JSON object, is a *torn tail*: an
  append that never completed (on a live log, an append in progress; after a crash, one that was
  never acknowledged). It is left out and reported as :class:`TornTail`;
* a bad line **followed by any other line** cannot be a torn append (the writer appends one whole
  line per ``write`` and cuts a failed one off at once), so it is corruption: ``LogCorrupted``
  naming the line number and byte offset. A whole line that parses but is not a valid record is
  corruption wherever it is;
* so is a whole line of JSON this reader refuses to hold: arrays and objects nested deeper than
  :data:`MAX_DEPTH`, or a number too large for a float. The writer never produces either, and
  a line it wrote to the end is not torn, so repair must not set it aside as a torn tail.

A file that is not a session folder's log (``iter_records("run.jsonl")``: say the captured
output of ``andon run --json``) may also hold the live-only lines of an agent's event stream
(no ``seq``, a type of :data:`LIVE_ONLY_TYPES`) and the final ``run/summary``: they are skipped
and counted. A line without ``seq`` of any other type is corruption there too, and a session
folder's own log (what ``load`` and ``repair`` read) never holds such lines at all.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, NoReturn, Protocol

from andon.base import LogCorrupted, SessionError
from andon.session._live import LIVE_EVENT_TYPES, LiveEvent
from andon.session._records import Record

__all__ = [
    "LIVE_ONLY_TYPES",
    "RecordStream",
    "Records",
    "TornTail",
    "is_live_only",
    "iter_records",
    "log_path",
    "read",
    "without_live_only",
]

LOG_NAME = "events.jsonl"

LIVE_ONLY_TYPES: frozenset[str] = LIVE_EVENT_TYPES | {"run/progress", "run/summary"}
"""The event types of ``agent.events()`` that are never log records (they carry no ``seq``), and
the lines of ``andon run --json`` of its own: liveness lines and the last line."""


def is_live_only(obj: Mapping[str, Any]) -> bool:
    """Whether a parsed line (or event) is a live-only event rather than a record: no ``seq``
    and a type of :data:`LIVE_ONLY_TYPES`."""
    return "seq" not in obj and obj.get("type") in LIVE_ONLY_TYPES


def without_live_only(events: Iterable[Any]) -> Iterator[Any]:
    """``events`` (records or plain dicts) without the live events, lazily: what a fold of the
    lines of ``andon run --json``, or of what ``Agent.events()`` yields, folds. Records pass
    untouched."""
    for event in events:
        if isinstance(event, LiveEvent) or (isinstance(event, Mapping) and is_live_only(event)):
            continue
        yield event


@dataclass(frozen=True, slots=True)
class TornTail:
    """An incomplete last line: ``length`` bytes at byte ``offset`` (line number ``line``)."""

    offset: int
    length: int
    line: int
    terminated: bool
    """Whether it ended with ``\\n`` (a whole line that does not parse, not a cut one)."""


MAX_DEPTH = 100
"""How deep arrays and objects may nest in one record. The format's deepest is five; the bound
keeps every later walk of a value (``json.dumps``, ``check``) far from Python's recursion limit."""
_TOO_DEEP = f"is nested too deeply (more than {MAX_DEPTH} levels of arrays and objects)"


class _Digest(Protocol):
    """What a ``hashlib`` object offers (``hashlib`` has no public type for it)."""

    def update(self, data: bytes, /) -> None: ...


class _Unholdable(Exception):
    """A whole line of JSON that no record can be: why, for the corruption message."""


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 is valid JSON, but Python would read it as infinity
        raise _Unholdable(f"holds the number {text[:40]}, too large for a float")
    return value


# The writer never produces NaN or Infinity (allow_nan=False): a line holding them does not parse.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _nested_deeper(obj: dict[str, Any], limit: int) -> bool:
    """Whether arrays and objects in ``obj`` nest more than ``limit`` levels (no recursion)."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def log_path(session: str | os.PathLike[str]) -> Path:
    """``session/events.jsonl`` for a session folder; a path to a log file is used as it is."""
    path = Path(session)
    return path if path.is_file() else path / LOG_NAME


def _decode(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """The JSON object of one line, or ``None`` and why it does not parse.

    ``_Unholdable`` if the line is JSON no record can be (nested too deeply, a huge number).
    """
    if not line.endswith(b"\n"):
        return None, "the line is not terminated by a newline"
    try:
        obj = _DECODER.decode(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "the line is not valid UTF-8"
    except RecursionError:  # json recurses once per level: this line alone is too deep
        raise _Unholdable(_TOO_DEEP) from None
    except ValueError as exc:
        return None, f"the line is not valid JSON ({exc})"
    if not isinstance(obj, dict):
        return None, "the line is not a JSON object"
    # Nesting needs at least one bracket per level, so most lines are cleared by counting them.
    if line.count(b"[") + line.count(b"{") > MAX_DEPTH and _nested_deeper(obj, MAX_DEPTH):
        raise _Unholdable(_TOO_DEEP)
    return obj, ""


class RecordStream(Iterator[Record]):
    """Records of a log, one at a time; the file is never held in memory.

    After the stream is exhausted, :attr:`torn` tells whether a torn tail was left out and
    :attr:`end_offset` is the byte length of the whole records (where a torn tail starts).
    """

    def __init__(
        self,
        path: Path,
        *,
        label: str | None = None,
        live_lines: bool = False,
        start: int = 0,
        start_line: int = 0,
        digest: _Digest | None = None,
    ) -> None:
        self.path = path
        self.label = label if label is not None else str(path.parent)
        self.torn: TornTail | None = None
        self.start = start
        """The byte offset reading starts at: the end of ``start_line`` whole lines, which the
        caller has already accounted for (the index of a long log, ``_index``)."""
        self.end_offset = start
        self.lines = start_line
        self.digest = digest
        """Fed every whole line read (a ``hashlib`` object): what the index's hash covers."""
        self.live_lines = live_lines
        """Whether live-only lines (``andon run --json``) are skipped; else they are corrupt."""
        self.skipped = 0
        """How many live-only lines were skipped."""
        if not path.is_file():
            raise SessionError(
                f"{path.parent} holds no session log ({path.name} is missing)", session=self.label
            )
        # The file is opened by the generator, so a stream that is never iterated holds nothing.
        self._gen = self._records()

    def __iter__(self) -> RecordStream:
        return self

    def __next__(self) -> Record:
        return next(self._gen)

    def close(self) -> None:
        """Stop early and close the file."""
        self._gen.close()

    def __enter__(self) -> RecordStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _records(self) -> Generator[Record, None, None]:
        with open(self.path, "rb") as file:
            if self.start:
                file.seek(self.start)
            yield from self._parse(file)

    def _parse(self, file: BinaryIO) -> Generator[Record, None, None]:
        readline = file.readline
        offset = self.start
        lineno = self.lines
        update = self.digest.update if self.digest is not None else None
        while line := readline():
            lineno += 1
            try:
                obj, why = _decode(line)
            except _Unholdable as exc:
                raise self._unholdable(lineno, offset, str(exc)) from None
            if obj is None:
                # An unterminated line ended at end of file when it was read: on a live log the
                # rest of it may be arriving right now, so never look past it. A whole line that
                # does not parse is a torn tail only if nothing follows it.
                if line.endswith(b"\n") and readline():
                    raise LogCorrupted(
                        f"{self.path}: line {lineno} (byte offset {offset}) is not a record "
                        f"({why}) and more lines follow it. That is corruption in the middle "
                        "of the log, not a torn write, so andon changes nothing; restore the "
                        "file from a backup or cut it by hand.",
                        session=self.label,
                        line=lineno,
                        offset=offset,
                    )
                self.torn = TornTail(offset, len(line), lineno, line.endswith(b"\n"))
                return
            if self.live_lines and is_live_only(obj):
                if update is not None:
                    update(line)
                offset += len(line)
                self.end_offset = offset
                self.lines = lineno
                self.skipped += 1
                continue
            try:
                record = Record.from_dict(obj, session=self.label)
            except ValueError as exc:
                raise LogCorrupted(
                    f"{self.path}: line {lineno} (byte offset {offset}) is JSON but not a "
                    f"valid record: {exc}",
                    session=self.label,
                    line=lineno,
                    offset=offset,
                ) from None
            if update is not None:
                update(line)
            offset += len(line)
            self.end_offset = offset
            self.lines = lineno
            yield record

    def _unholdable(self, lineno: int, offset: int, why: str) -> LogCorrupted:
        return LogCorrupted(
            f"{self.path}: line {lineno} (byte offset {offset}) {why}; andon never writes "
            "that, so the log is corrupt, not torn, and andon changes nothing",
            session=self.label,
            line=lineno,
            offset=offset,
        )


class Records(list[Record]):
    """A list of records that also says whether a torn tail was left out (``torn``) and how many
    live-only lines of a file were skipped (``skipped``)."""

    torn: TornTail | None = None
    skipped: int = 0


def iter_records(session: str | os.PathLike[str]) -> RecordStream:
    """Stream the records of a session: a folder, or the path of a file of records (its
    ``events.jsonl``, or the saved output of ``andon run --json``).

    Neither locks nor repairs. A torn tail is left out and reported in ``stream.torn`` once the
    stream is exhausted; a bad line in the middle raises ``LogCorrupted``; an unknown record type
    raises ``LogFormatUnsupported`` unless the record is ignorable. Of a file given by its path,
    live-only lines (no ``seq``, a type of :data:`LIVE_ONLY_TYPES`) are skipped and counted in
    ``stream.skipped``.
    """
    path = log_path(session)
    return RecordStream(path, label=str(Path(session)), live_lines=path == Path(session))


def read(session: str | os.PathLike[str]) -> Records:
    """All records of a session as a list (``.torn`` reports a torn tail, ``.skipped`` the
    live-only lines of a file). No lock, no repair."""
    stream = iter_records(session)
    records = Records(stream)
    records.torn = stream.torn
    records.skipped = stream.skipped
    return records
