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
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias, final

from andon.base import LogFormatUnsupported, catch_all
from andon.session._context_events import ContextCompacted, ContextTrimmed
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
from andon.session._tool_events import McpServerEvent, ToolCall, ToolResult, ToolSignal, ToolStarted
from andon.session._values import OMIT, LogValue, RecordData

__all__ = [
    "FORMAT_VERSION",
    "AssistantChunk",
    "AssistantMessage",
    "ContextCompacted",
    "ContextTrimmed",
    "EventData",
    "InboxSpliced",
    "LlmRequest",
    "LlmRetry",
    "McpServerEvent",
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

FORMAT_VERSION = 2
"""The ``format`` this version writes into ``session/start``. Format 2 added the compaction
records (``context/*``): an andon that reads format 1 only would rebuild a compacted history
wrongly, so it must refuse such a log rather than skip its records."""

SUPPORTED_FORMATS = frozenset({1, FORMAT_VERSION})
"""Every format this version reads: a format 1 log is a format 2 log without compaction."""


@final
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
    | ContextTrimmed
    | ContextCompacted
    | McpServerEvent
    | Unrecognized
)

_KNOWN: tuple[type[RecordData], ...] = (
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
    ContextTrimmed,
    ContextCompacted,
    McpServerEvent,
)
_CLASSES: dict[str, type[RecordData]] = {c.record_type: c for c in _KNOWN}

RECORD_TYPES: frozenset[str] = frozenset(_CLASSES)
"""Every record type this version reads and writes."""


@dataclass(frozen=True, slots=True)
class _Envelope(LogValue):
    """A line as it stands, before its ``data`` is read as the class its ``type`` names."""

    seq: int
    time: float
    type: str
    data: Mapping[str, Any]
    synthetic: Annotated[str | None, OMIT] = None
    ignorable: Annotated[bool, OMIT] = False


@final
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
    extra: Mapping[str, Any] = catch_all()

    @property
    def type(self) -> str:
        """The record type, e.g. ``"tool/result"``."""
        return self.data.record_type

    def to_dict(self) -> dict[str, Any]:
        """The exact JSON object of docs/log-format.md, Records."""
        envelope = _Envelope(
            self.seq,
            self.time,
            self.data.record_type,
            self.data.to_json(),
            self.synthetic,
            self.ignorable,
            extra=self.extra,
        )
        return envelope.to_json()

    @classmethod
    def from_dict(cls, obj: object, *, session: str | None = None) -> Record:
        """Parse one record (a dict as ``json.loads`` returns it).

        ``ValueError`` names a malformed field; ``LogFormatUnsupported`` an unknown type (unless the
        record is ignorable), an unknown ``synthetic`` marker or an unknown ``format``.
        """
        # Errors name the record by its seq as soon as there is one to name it by.
        seq = obj.get("seq") if isinstance(obj, dict) else None
        where = f"record {seq}" if type(seq) is int else "record"
        line = _Envelope.from_json(obj, where)
        where = f"record {line.seq}"
        type_ = line.type
        if line.synthetic is not None and line.synthetic != "repair":
            raise LogFormatUnsupported(
                f"{where} ({type_}) is marked synthetic {line.synthetic!r}, which this version of "
                "andon does not know; it was written by a newer andon",
                session=session,
                seq=line.seq,
                record_type=type_,
            )
        known = _CLASSES.get(type_)
        data: EventData
        if known is None:
            if not line.ignorable:
                raise LogFormatUnsupported(
                    f"{where} has type {type_!r}, which this version of andon does not know and "
                    "which is not marked ignorable; it was written by a newer andon",
                    session=session,
                    seq=line.seq,
                    record_type=type_,
                )
            data = Unrecognized(type_, line.data)
        else:
            data = typing.cast(EventData, known.from_json(line.data, f"{where} ({type_}) data"))
            if isinstance(data, SessionStart) and data.format not in SUPPORTED_FORMATS:
                raise LogFormatUnsupported(
                    f"the session log has format {data.format}; this version of andon reads "
                    f"formats {', '.join(map(str, sorted(SUPPORTED_FORMATS)))}",
                    session=session,
                    seq=line.seq,
                    record_type=type_,
                )
        synthetic: Literal["repair"] | None = "repair" if line.synthetic else None
        return cls(line.seq, line.time, data, synthetic, line.ignorable, extra=line.extra)


def encode_line(record: Record, obj: dict[str, Any] | None = None) -> bytes:
    """The bytes of one log line: compact UTF-8 JSON, no NaN or infinity, ``\\n``-terminated.
    ``obj`` is ``record.to_dict()`` if the caller has it already (it is not computed twice).

    ``ValueError`` (NaN, a lone surrogate, a value JSON cannot hold) is raised before anything is
    written, so a bad value never reaches the file.
    """
    try:
        text = json.dumps(
            record.to_dict() if obj is None else obj,
            allow_nan=False,
            ensure_ascii=False,
            separators=(",", ":"),
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
