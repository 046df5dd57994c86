"""The data of each record type but the tool records (docs/log-format.md, Records).

One frozen class per ``type``; ``to_json`` gives the exact ``data`` object of docs/log-format.md and
``from_json`` reads it back, keeping keys it does not know in ``extra``. The tool records are in
``_tool_events``; the envelope (``Record``) is in ``_records``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

from andon.base import ReplyFinish, shape
from andon.session._values import (
    COUNT,
    OMIT,
    PID,
    AssistantReply,
    AttemptData,
    ModelInfo,
    RecordData,
    StepData,
    TurnData,
    TurnEndReason,
    UserMessage,
    count_problem,
)

__all__ = [
    "AssistantChunk",
    "AssistantMessage",
    "InboxSpliced",
    "InboxTarget",
    "LlmRequest",
    "LlmRetry",
    "SessionRepaired",
    "SessionResumed",
    "SessionStart",
    "StepEnd",
    "StepStart",
    "TurnEnd",
    "TurnStart",
    "UserMessageEntered",
]

InboxTarget: TypeAlias = Literal["next-turn", "next-step"]


# --- session ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionStart(RecordData):
    """``session/start``: the first record of every session."""

    format: int
    session_id: str
    andon_version: str
    created: float
    cwd: str
    model: ModelInfo
    system_prompt: str
    pid: Annotated[int, PID]
    host: str
    record_type: ClassVar[str] = "session/start"


@dataclass(frozen=True, slots=True)
class SessionResumed(RecordData):
    """``session/resumed``: a new process took the session over (its system prompt from here on)."""

    pid: Annotated[int, PID]
    host: str
    andon_version: str
    model: ModelInfo
    system_prompt: str
    repaired: bool
    record_type: ClassVar[str] = "session/resumed"


@dataclass(frozen=True, slots=True)
class SessionRepaired(RecordData):
    """``session/repaired``: crash repair's summary, written after its closers.

    ``torn_file`` is shown as ``null`` when no torn bytes were moved aside.
    """

    torn_bytes: int
    torn_file: str | None
    closers: int
    killed_leftovers: int
    record_type: ClassVar[str] = "session/repaired"


@dataclass(frozen=True, slots=True)
class InboxSpliced(RecordData):
    """``agent/inbox/spliced``: one change of an inbox list.

    On list ``target``, ``removed_count`` items (0 when absent) are removed at ``start`` and
    ``inserted`` put there. A claim is a splice without ``outcome``; a cancel that clears the inbox
    has ``outcome: "canceled"``.
    """

    target: InboxTarget
    start: Annotated[int, COUNT]
    inserted: tuple[UserMessage, ...] = ()
    removed_count: Annotated[int | None, shape(omit=True, check=count_problem)] = None
    outcome: Annotated[Literal["canceled"] | None, OMIT] = None
    record_type: ClassVar[str] = "agent/inbox/spliced"
    json_keys: ClassVar = ("target", "start", "removed_count", "inserted", "outcome")

    @property
    def removed(self) -> int:
        return self.removed_count or 0


# --- turns and steps ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnStart(TurnData):
    """``turn/start``: turns are numbered 1, 2, … per session and continue after a resume."""

    record_type: ClassVar[str] = "turn/start"


@dataclass(frozen=True, slots=True)
class TurnEnd(TurnData):
    """``turn/end``: exactly one per turn, saying how it ended."""

    reason: TurnEndReason
    record_type: ClassVar[str] = "turn/end"


@dataclass(frozen=True, slots=True)
class StepStart(StepData):
    """``step/start``: steps restart at 1 in each turn."""

    record_type: ClassVar[str] = "step/start"


@dataclass(frozen=True, slots=True)
class StepEnd(StepData):
    """``step/end``: written in a ``finally`` (or by crash repair)."""

    record_type: ClassVar[str] = "step/end"


@dataclass(frozen=True, slots=True)
class UserMessageEntered(StepData):
    """``user/message``: one message entered into a step (right after ``step/start``)."""

    message: UserMessage
    record_type: ClassVar[str] = "user/message"


# --- the model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlmRequest(AttemptData):
    """``llm/request``: before each model request (``attempt`` starts at 1)."""

    model: str
    record_type: ClassVar[str] = "llm/request"


@dataclass(frozen=True, slots=True)
class LlmRetry(AttemptData):
    """``llm/retry``: a failed request is retried after ``delay`` seconds.

    ``error`` is the model error as an object (``code``, ``message``, optionally ``status``).
    """

    error: Mapping[str, Any]
    delay: float
    record_type: ClassVar[str] = "llm/retry"


@dataclass(frozen=True, slots=True)
class AssistantChunk(AttemptData):
    """``assistant/chunk``: stream deltas as received (never model-visible; folds skip them)."""

    deltas: tuple[Mapping[str, Any], ...]
    record_type: ClassVar[str] = "assistant/chunk"


@dataclass(frozen=True, slots=True)
class AssistantMessage(StepData):
    """``assistant/message``: a finished reply, or (``interrupted``) the salvaged prefix of one.

    ``finish`` is ``stop``, ``tool_calls``, ``length`` or ``aborted``. A ``length`` reply's tool
    calls are not kept; their number is ``dropped_tool_calls``.
    """

    message: AssistantReply
    finish: ReplyFinish
    usage: Annotated[Mapping[str, Any] | None, OMIT] = None
    interrupted: Annotated[bool, OMIT] = False
    dropped_tool_calls: Annotated[int | None, OMIT] = None
    record_type: ClassVar[str] = "assistant/message"
