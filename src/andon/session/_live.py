"""What :meth:`Agent.events() <andon.supervisor.Agent.events>` yields: :data:`AgentEvent`.

An event is either a log :class:`Record` as it was written (its ``data`` one of the record
classes), or a live event: one of the frozen classes below, which say what is happening now and
are never written to the log (they carry no ``seq``). A consumer matches on the classes
(``case Record(data=ToolResult() as result)``, ``case ToolOutput(text=text)``) and ends with
``assert_never``, so an event kind added later is a type error where it is not handled, never a
silently skipped string.

The live classes are declared beside the records, so that a reader of events (the CLI's views, a
fold over the lines of ``andon run --json``) needs this package and not the agent's; and with the
log's shape codec (:class:`LogValue`), like the records: :meth:`to_dict` gives the JSON object
``andon run --json`` prints for the event, and :func:`event_from_dict` reads one back
(docs/agent-loop.md, Events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeAlias, final, get_args

from andon.base import shape
from andon.session._records import Record
from andon.session._values import LogValue

__all__ = [
    "LIVE_EVENT_TYPES",
    "AgentError",
    "AgentEvent",
    "AgentStatus",
    "AssistantDelta",
    "LiveEvent",
    "Status",
    "SubagentEvent",
    "ToolOutput",
    "event_from_dict",
]

Status: TypeAlias = Literal["idle", "running"]
"""What ``Agent.status`` says: ``"running"`` only while a turn runs."""


@dataclass(frozen=True, slots=True)
class _Live(LogValue):
    """A live event: its JSON object is tagged ``{"type": ...}`` and has no ``seq``."""

    json_tag: ClassVar[tuple[str, str]]

    @property
    def type(self) -> str:
        """The event type, e.g. ``"tool/output"`` (as ``Record.type`` is a record's)."""
        return self.json_tag[1]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the event, as ``andon run --json`` prints it."""
        return self.to_json()


@final
@dataclass(frozen=True, slots=True)
class AgentStatus(_Live):
    """``agent/status``: the agent went ``running`` or ``idle`` (only on a change)."""

    status: Status
    json_tag: ClassVar = ("type", "agent/status")


@final
@dataclass(frozen=True, slots=True)
class AgentError(_Live):
    """``agent/error``: a turn failed for a reason of andon's own (or a hook's, or the model's),
    or the log could not be written (``LOG_WRITE_FAILED``). On the wire the two fields sit in an
    ``error`` object: ``{"type": "agent/error", "error": {"code", "message"}}``."""

    code: str
    message: str
    json_tag: ClassVar = ("type", "agent/error")
    json_nest: ClassVar = "error"


@final
@dataclass(frozen=True, slots=True)
class AssistantDelta(_Live):
    """``assistant/delta``: one stream delta as it arrives, shaped as in ``assistant/chunk``
    (docs/log-format.md, Streamed deltas); the chunk record holding it follows within 16 ms."""

    turn: int
    step: int
    attempt: int
    delta: Mapping[str, Any]
    json_tag: ClassVar = ("type", "assistant/delta")


@final
@dataclass(frozen=True, slots=True)
class ToolOutput(_Live):
    """``tool/output``: output of a running tool call as it streams (the result holds it all)."""

    call_id: str
    text: str
    json_tag: ClassVar = ("type", "tool/output")


def _encode_event(event: AgentEvent) -> dict[str, Any]:
    return event.to_dict()


def _decode_event(value: object) -> AgentEvent:
    return event_from_dict(value)


@final
@dataclass(frozen=True, slots=True)
class SubagentEvent(_Live):
    """``subagent/event``: an event of the child agent that subagent call ``call_id`` runs (its
    records are in its own log, ``subagents/<call_id>/events.jsonl``)."""

    call_id: str
    event: Annotated[AgentEvent, shape(codec=(_encode_event, _decode_event))]
    json_tag: ClassVar = ("type", "subagent/event")


LiveEvent: TypeAlias = AgentStatus | AgentError | AssistantDelta | ToolOutput | SubagentEvent
"""An event that is never logged."""

AgentEvent: TypeAlias = Record | LiveEvent
"""What ``Agent.events()`` yields: a log record as written, or a live event."""

_LIVE: dict[str, type[LiveEvent]] = {cls.json_tag[1]: cls for cls in get_args(LiveEvent)}

LIVE_EVENT_TYPES: frozenset[str] = frozenset(_LIVE)
"""The ``type`` of every live event (``tool/output``, …), read off the classes above."""


def event_from_dict(obj: object) -> AgentEvent:
    """An event read back from its JSON object (a line of ``andon run --json`` but its own
    ``run/*`` lines, or ``to_dict()``): a record when it has a ``seq``, else a live event.
    ``ValueError`` names what is wrong; ``LogFormatUnsupported`` a record of an unknown type."""
    if not isinstance(obj, dict):
        raise ValueError(f"an event is a JSON object, not {type(obj).__name__}")
    if "seq" in obj:
        return Record.from_dict(obj)
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in _LIVE:
        known = ", ".join(sorted(_LIVE))
        raise ValueError(f"an event without a seq has type {kind!r}, not one of {known}")
    return _LIVE[kind].from_json(obj, kind)
