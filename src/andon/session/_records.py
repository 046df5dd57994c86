"""Records: the typed form of every line of ``events.jsonl`` (docs/log-format.md, Records).

A :class:`Record` is the envelope (``seq``, ``time``, ``synthetic``, ``ignorable``) around one
typed, frozen ``data`` value; ``record.type`` is the data's type string. ``Record.from_dict`` and
``Record.to_dict`` convert to and from exactly that JSON, and :func:`encode_line` is
the one place that turns a record into the bytes of a log line.

Folds match on ``record.data`` (``case ToolCall(call_id=...)``), so the set of data classes is
closed: :data:`EventData`. A record of a type this version does not know is refused
(``LogFormatUnsupported``) unless it carries ``"ignorable": true``; then it is kept as
:class:`Unrecognized` and every fold skips it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from andon.base import LogFormatUnsupported
from andon.session._events import (
    AssistantChunk,
    AssistantMessage,
    InboxSpliced,
    LlmRequest,
    LlmRetry,
    SessionRepaired,
    SessionResumed,
    SessionStart,
    StepEnd,
    StepStart,
    TurnEnd,
    TurnStart,
    UserMessageEntered,
)
from andon.session._tool_events import ToolCall, ToolResult, ToolSignal, ToolStarted
from andon.session._values import Fields, check_pid, extra_field, with_extra

__all__ = [
    "FORMAT_VERSION",
    "AssistantChunk",
    "AssistantMessage",
    "EventData",
    "InboxSpliced",
    "LlmRequest",
    "LlmRetry",
    "Record",
    "SessionRepaired",
    "SessionResumed",
    "SessionStart",
    "StepEnd",
    "StepStart",
    "ToolCall",
    "ToolResult",
    "ToolSignal",
    "ToolStarted",
    "TurnEnd",
    "TurnStart",
    "Unrecognized",
    "UserMessageEntered",
    "as_records",
    "encode_line",
]

FORMAT_VERSION = 1
"""The ``format`` this version writes into ``session/start`` and the only one it reads."""

SUPPORTED_FORMATS = frozenset({FORMAT_VERSION})


@dataclass(frozen=True, slots=True)
class Unrecognized:
    """An ``"ignorable": true`` record of a type this version does not know: kept, never folded."""

    record_type: str
    fields: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)


EventData: TypeAlias = (
    SessionStart
    | SessionResumed
    | SessionRepaired
    | InboxSpliced
    | TurnStart
    | TurnEnd
    | StepStart
    | StepEnd
    | UserMessageEntered
    | LlmRequest
    | LlmRetry
    | AssistantChunk
    | AssistantMessage
    | ToolCall
    | ToolStarted
    | ToolSignal
    | ToolResult
    | Unrecognized
)

_KNOWN: tuple[type[Any], ...] = (
    SessionStart,
    SessionResumed,
    SessionRepaired,
    InboxSpliced,
    TurnStart,
    TurnEnd,
    StepStart,
    StepEnd,
    UserMessageEntered,
    LlmRequest,
    LlmRetry,
    AssistantChunk,
    AssistantMessage,
    ToolCall,
    ToolStarted,
    ToolSignal,
    ToolResult,
)
_PARSERS: dict[str, Callable[[Fields], EventData]] = {c.record_type: c.from_json for c in _KNOWN}

RECORD_TYPES: frozenset[str] = frozenset(_PARSERS)
"""Every record type this version reads and writes."""


@dataclass(frozen=True, slots=True)
class Record:
    """One line of the log: ``{"seq", "time", "type", "data"}`` plus the optional markers.

    ``synthetic`` is ``"repair"`` on records crash repair wrote; ``ignorable`` marks a record an
    older reader may skip. ``type`` is derived from ``data``.
    """

    seq: int
    time: float
    data: EventData
    synthetic: Literal["repair"] | None = None
    ignorable: bool = False
    extra: Mapping[str, Any] = extra_field()

    @property
    def type(self) -> str:
        """The record type, e.g. ``"tool/result"``."""
        return self.data.record_type

    def to_dict(self) -> dict[str, Any]:
        """The exact JSON object docs/log-format.md shows."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "time": self.time,
            "type": self.data.record_type,
            "data": self.data.to_json(),
        }
        if self.synthetic is not None:
            out["synthetic"] = self.synthetic
        if self.ignorable:
            out["ignorable"] = True
        return with_extra(out, self.extra)

    @classmethod
    def from_dict(cls, obj: object, *, session: str | None = None) -> Record:
        """Parse one record (a dict as ``json.loads`` returns it).

        ``ValueError`` names a malformed field; ``LogFormatUnsupported`` an unknown type (unless the
        record is ignorable), an unknown ``synthetic`` marker or an unknown ``format``.
        """
        f = Fields(obj, "record")
        seq = f.req_int("seq")
        where = f"record {seq}"
        f.where = where
        time = f.req_num("time")
        type_ = f.req_str("type")
        data_obj = f.req_obj("data")
        ignorable = f.flag("ignorable")
        synthetic = f.opt_str("synthetic")
        if synthetic is not None and synthetic != "repair":
            raise LogFormatUnsupported(
                f"{where} ({type_}) is marked synthetic {synthetic!r}, which this version of andon "
                "does not know; it was written by a newer andon",
                session=session,
                seq=seq,
                record_type=type_,
            )
        parser = _PARSERS.get(type_)
        data: EventData
        if parser is None:
            if not ignorable:
                raise LogFormatUnsupported(
                    f"{where} has type {type_!r}, which this version of andon does not know and "
                    "which is not marked ignorable; it was written by a newer andon",
                    session=session,
                    seq=seq,
                    record_type=type_,
                )
            data = Unrecognized(type_, data_obj)
        else:
            data = parser(Fields(data_obj, f"{where} ({type_}) data"))
            _check_process_ids(data, f"{where} ({type_}) data")
            if isinstance(data, SessionStart) and data.format not in SUPPORTED_FORMATS:
                raise LogFormatUnsupported(
                    f"the session log has format {data.format}; this version of andon reads format "
                    f"{FORMAT_VERSION} only",
                    session=session,
                    seq=seq,
                    record_type=type_,
                )
        return cls(seq, time, data, "repair" if synthetic else None, ignorable, f.extra())


def _check_process_ids(data: EventData, where: str) -> None:
    """Refuse a process id no kernel hands out, once, where the record is read: crash repair
    looks the ids of ``tool/started`` up and signals what it finds, and to ``kill`` 0 or a
    negative number is a whole process group, so nothing after the reader may see one."""
    match data:
        case ToolStarted(pid=pid, pgid=pgid):
            check_pid(pid, f"{where}.pid")
            check_pid(pgid, f"{where}.pgid")
        case SessionStart(pid=pid) | SessionResumed(pid=pid):
            check_pid(pid, f"{where}.pid")
        case _:
            pass


def encode_line(record: Record) -> bytes:
    """The bytes of one log line: compact UTF-8 JSON, no NaN or infinity, ``\\n``-terminated.

    ``ValueError`` (NaN, a lone surrogate, a value JSON cannot hold) is raised before anything is
    written, so a bad value never reaches the file.
    """
    try:
        text = json.dumps(
            record.to_dict(), allow_nan=False, ensure_ascii=False, separators=(",", ":")
        )
    except (TypeError, ValueError) as exc:  # NaN, infinity, a set, bytes ...
        raise ValueError(f"record {record.seq} cannot be written as JSON: {exc}") from None
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"record {record.seq} holds text that is not valid Unicode: {exc}"
        ) from None


def as_records(events: Iterable[Record | Mapping[str, Any]]) -> Iterator[Record]:
    """Records as they are, or parsed from plain dicts (``json.loads`` of each line), lazily."""
    for event in events:
        if isinstance(event, Record):
            yield event
        else:
            yield Record.from_dict(dict(event) if not isinstance(event, dict) else event)
