"""The data of each record type but the tool records (docs/log-format.md, Records).

One frozen class per ``type``; ``to_json`` gives the exact ``data`` object of docs/log-format.md and
``from_json`` reads it back, keeping keys it does not know in ``extra``. The tool records are in
``_tool_events``; the envelope (``Record``) is in ``_records``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeAlias, final

from andon.base import ReplyFinish, shape
from andon.session._values import (
    COUNT,
    OMIT,
    PID,
    AssistantReply,
    AttemptData,
    LogValue,
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
    "InstructionFile",
    "LlmRequest",
    "LlmRetry",
    "ProjectInstructions",
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
class InstructionFile(LogValue):
    """One project instructions file whose text is in the system prompt (docs/agent-loop.md,
    Project instructions)."""

    path: str
    """Relative to ``ProjectInstructions.root``, with ``/`` (``AGENTS.md``, ``pkg/AGENTS.md``)."""
    sha256: str
    """The SHA-256 of the bytes read (all of them, or the first ``bytes`` when truncated), as
    64 lower-case hex digits: ``sha256sum`` of the file when it was not truncated."""
    bytes: Annotated[int, COUNT]
    """How many bytes of the file were read and put into the prompt."""
    truncated: Annotated[bool, OMIT] = False
    """The file was longer than andon's cap; the prompt says so where its text is cut."""
    json_keys: ClassVar = ("path", "sha256", "bytes", "truncated")


@final
@dataclass(frozen=True, slots=True)
class ProjectInstructions(LogValue):
    """The project instructions added to the system prompt, outermost first."""

    root: str
    """The folder the paths are relative to: the git root, or the working directory when there
    is none (a file name, spelled as ``session/start.cwd`` is)."""
    files: tuple[InstructionFile, ...]
    chars: Annotated[int, COUNT]
    """How many characters (code points) at the end of ``system_prompt`` the instructions take:
    what is before them is the base text (andon's own, or a ``--system`` file's)."""


@final
@dataclass(frozen=True, slots=True)
class SessionStart(RecordData, record_type="session/start"):
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
    project_instructions: Annotated[ProjectInstructions | None, OMIT] = None
    """Absent when none were added (none found, or turned off)."""


@final
@dataclass(frozen=True, slots=True)
class SessionResumed(RecordData, record_type="session/resumed"):
    """``session/resumed``: a new process took the session over (its system prompt from here on)."""

    pid: Annotated[int, PID]
    host: str
    andon_version: str
    model: ModelInfo
    system_prompt: str
    repaired: bool
    project_instructions: Annotated[ProjectInstructions | None, OMIT] = None
    """Read again by this process: absent when none were added."""


@final
@dataclass(frozen=True, slots=True)
class SessionRepaired(RecordData, record_type="session/repaired"):
    """``session/repaired``: crash repair's summary, written after its closers.

    ``torn_file`` is shown as ``null`` when no torn bytes were moved aside.
    """

    torn_bytes: int
    torn_file: str | None
    closers: int
    killed_leftovers: int


@final
@dataclass(frozen=True, slots=True)
class InboxSpliced(RecordData, record_type="agent/inbox/spliced"):
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
    json_keys: ClassVar = ("target", "start", "removed_count", "inserted", "outcome")

    @property
    def removed(self) -> int:
        return self.removed_count or 0


# --- turns and steps ----------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class TurnStart(TurnData, record_type="turn/start"):
    """``turn/start``: the first record of a turn, before anything the turn does; its one
    ``turn/end`` is the last (docs/log-format.md, The rules a log always keeps)."""


@final
@dataclass(frozen=True, slots=True)
class TurnEnd(TurnData, record_type="turn/end"):
    """``turn/end``: exactly one per turn, saying how it ended."""

    reason: TurnEndReason
    """How: completed, max-tokens, blocked, aborted (with its cause), error, or interrupted."""


@final
@dataclass(frozen=True, slots=True)
class StepStart(StepData, record_type="step/start"):
    """``step/start``: steps restart at 1 in each turn; the messages entered into the step follow
    it at once."""


@final
@dataclass(frozen=True, slots=True)
class StepEnd(StepData, record_type="step/end"):
    """``step/end``: written in a ``finally`` (or by crash repair)."""


@final
@dataclass(frozen=True, slots=True)
class UserMessageEntered(StepData, record_type="user/message"):
    """``user/message``: one message entered into a step (right after ``step/start``)."""

    message: UserMessage
    """The message as the model sees it, with the id and source it was entered with."""


# --- the model ----------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class LlmRequest(AttemptData, record_type="llm/request"):
    """``llm/request``: before each model request (``attempt`` starts at 1)."""

    model: str
    """The provider's model name the request asks for."""


@final
@dataclass(frozen=True, slots=True)
class LlmRetry(AttemptData, record_type="llm/retry"):
    """``llm/retry``: a failed request is retried after ``delay`` seconds.

    ``error`` is the model error as an object (``code``, ``message``, optionally ``status``).
    """

    error: Mapping[str, Any]
    delay: float


@final
@dataclass(frozen=True, slots=True)
class AssistantChunk(AttemptData, record_type="assistant/chunk"):
    """``assistant/chunk``: stream deltas as received (never model-visible; folds skip them)."""

    deltas: tuple[Mapping[str, Any], ...]


@final
@dataclass(frozen=True, slots=True)
class AssistantMessage(StepData, record_type="assistant/message"):
    """``assistant/message``: a finished reply, or (``interrupted``) the salvaged prefix of one.

    ``finish`` is ``stop``, ``tool_calls``, ``length`` or ``aborted``. A ``length`` reply's tool
    calls are not kept; their number is ``dropped_tool_calls``.
    """

    message: AssistantReply
    finish: ReplyFinish
    usage: Annotated[Mapping[str, Any] | None, OMIT] = None
    interrupted: Annotated[bool, OMIT] = False
    dropped_tool_calls: Annotated[int | None, OMIT] = None
