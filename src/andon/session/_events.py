"""The data of each record type but the tool records (docs/log-format.md, Records).

One frozen class per ``type``; ``to_json`` gives the exact ``data`` object of docs/log-format.md and
``from_json`` reads it back, keeping keys it does not know in ``extra``. The tool records are in
``_tool_events``; the envelope (``Record``) is in ``_records``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from andon.base import REPLY_FINISHES, ReplyFinish
from andon.session._values import (
    AssistantReply,
    Fields,
    ModelInfo,
    TurnEndReason,
    UserMessage,
    extra_field,
    reason_from_json,
    with_extra,
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
_TARGETS = frozenset(("next-turn", "next-step"))


# --- session ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionStart:
    """``session/start``: the first record of every session."""

    format: int
    session_id: str
    andon_version: str
    created: float
    cwd: str
    model: ModelInfo
    system_prompt: str
    pid: int
    host: str
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "session/start"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "format": self.format,
                "session_id": self.session_id,
                "andon_version": self.andon_version,
                "created": self.created,
                "cwd": self.cwd,
                "model": self.model.to_json(),
                "system_prompt": self.system_prompt,
                "pid": self.pid,
                "host": self.host,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> SessionStart:
        return cls(
            f.req_int("format"),
            f.req_str("session_id"),
            f.req_str("andon_version"),
            f.req_num("created"),
            f.req_str("cwd"),
            ModelInfo.from_json(f.req_obj("model"), f"{f.where}.model"),
            f.req_str("system_prompt"),
            f.req_int("pid"),
            f.req_str("host"),
            f.extra(),
        )


@dataclass(frozen=True, slots=True)
class SessionResumed:
    """``session/resumed``: a new process took the session over (its system prompt from here on)."""

    pid: int
    host: str
    andon_version: str
    model: ModelInfo
    system_prompt: str
    repaired: bool
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "session/resumed"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "pid": self.pid,
                "host": self.host,
                "andon_version": self.andon_version,
                "model": self.model.to_json(),
                "system_prompt": self.system_prompt,
                "repaired": self.repaired,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> SessionResumed:
        return cls(
            f.req_int("pid"),
            f.req_str("host"),
            f.req_str("andon_version"),
            ModelInfo.from_json(f.req_obj("model"), f"{f.where}.model"),
            f.req_str("system_prompt"),
            f.req_bool("repaired"),
            f.extra(),
        )


@dataclass(frozen=True, slots=True)
class SessionRepaired:
    """``session/repaired``: crash repair's summary, written after its closers.

    ``torn_file`` is shown as ``null`` when no torn bytes were moved aside.
    """

    torn_bytes: int
    torn_file: str | None
    closers: int
    killed_leftovers: int
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "session/repaired"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "torn_bytes": self.torn_bytes,
                "torn_file": self.torn_file,
                "closers": self.closers,
                "killed_leftovers": self.killed_leftovers,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> SessionRepaired:
        return cls(
            f.req_int("torn_bytes"),
            f.nullable_str("torn_file"),
            f.req_int("closers"),
            f.req_int("killed_leftovers"),
            f.extra(),
        )


@dataclass(frozen=True, slots=True)
class InboxSpliced:
    """``agent/inbox/spliced``: one change of an inbox list.

    On list ``target``, ``removed_count`` items (0 when absent) are removed at ``start`` and
    ``inserted`` put there. A claim is a splice without ``outcome``; a cancel that clears the inbox
    has ``outcome: "canceled"``.
    """

    target: InboxTarget
    start: int
    inserted: tuple[UserMessage, ...] = ()
    removed_count: int | None = None
    outcome: Literal["canceled"] | None = None
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "agent/inbox/spliced"

    @property
    def removed(self) -> int:
        return self.removed_count or 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "start": self.start}
        if self.removed_count is not None:
            out["removed_count"] = self.removed_count
        out["inserted"] = [m.to_json() for m in self.inserted]
        if self.outcome is not None:
            out["outcome"] = self.outcome
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> InboxSpliced:
        target: Any = f.req_choice("target", _TARGETS)
        start = f.req_int("start")
        removed = f.opt_int("removed_count")
        items = f.req_list("inserted")
        inserted = tuple(
            UserMessage.from_json(m, f"{f.where}.inserted[{i}]") for i, m in enumerate(items)
        )
        outcome: Any = f.opt_choice("outcome", frozenset(("canceled",)))
        if start < 0 or (removed is not None and removed < 0):
            raise ValueError(f"{f.where}: start and removed_count cannot be negative")
        return cls(target, start, inserted, removed, outcome, f.extra())


# --- turns and steps ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnStart:
    """``turn/start``: turns are numbered 1, 2, … per session and continue after a resume."""

    turn: int
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "turn/start"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"turn": self.turn}, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> TurnStart:
        return cls(f.req_int("turn"), f.extra())


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """``turn/end``: exactly one per turn, saying how it ended."""

    turn: int
    reason: TurnEndReason
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "turn/end"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"turn": self.turn, "reason": self.reason.to_json()}, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> TurnEnd:
        turn = f.req_int("turn")
        return cls(turn, reason_from_json(f.req_obj("reason"), f"{f.where}.reason"), f.extra())


@dataclass(frozen=True, slots=True)
class StepStart:
    """``step/start``: steps restart at 1 in each turn."""

    turn: int
    step: int
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "step/start"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"turn": self.turn, "step": self.step}, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> StepStart:
        return cls(f.req_int("turn"), f.req_int("step"), f.extra())


@dataclass(frozen=True, slots=True)
class StepEnd:
    """``step/end``: written in a ``finally`` (or by crash repair)."""

    turn: int
    step: int
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "step/end"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"turn": self.turn, "step": self.step}, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> StepEnd:
        return cls(f.req_int("turn"), f.req_int("step"), f.extra())


@dataclass(frozen=True, slots=True)
class UserMessageEntered:
    """``user/message``: one message entered into a step (right after ``step/start``)."""

    turn: int
    step: int
    message: UserMessage
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "user/message"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {"turn": self.turn, "step": self.step, "message": self.message.to_json()}, self.extra
        )

    @classmethod
    def from_json(cls, f: Fields) -> UserMessageEntered:
        turn, step = f.req_int("turn"), f.req_int("step")
        message = UserMessage.from_json(f.req_obj("message"), f"{f.where}.message")
        return cls(turn, step, message, f.extra())


# --- the model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """``llm/request``: before each model request (``attempt`` starts at 1)."""

    turn: int
    step: int
    attempt: int
    model: str
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "llm/request"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {"turn": self.turn, "step": self.step, "attempt": self.attempt, "model": self.model},
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> LlmRequest:
        turn, step = f.req_int("turn"), f.req_int("step")
        return cls(turn, step, f.req_int("attempt"), f.req_str("model"), f.extra())


@dataclass(frozen=True, slots=True)
class LlmRetry:
    """``llm/retry``: a failed request is retried after ``delay`` seconds.

    ``error`` is the model error as an object (``code``, ``message``, optionally ``status``).
    """

    turn: int
    step: int
    attempt: int
    error: Mapping[str, Any]
    delay: float
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "llm/retry"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "turn": self.turn,
                "step": self.step,
                "attempt": self.attempt,
                "error": dict(self.error),
                "delay": self.delay,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> LlmRetry:
        turn, step, attempt = f.req_int("turn"), f.req_int("step"), f.req_int("attempt")
        return cls(turn, step, attempt, f.req_obj("error"), f.req_num("delay"), f.extra())


@dataclass(frozen=True, slots=True)
class AssistantChunk:
    """``assistant/chunk``: stream deltas as received (never model-visible; folds skip them)."""

    turn: int
    step: int
    attempt: int
    deltas: tuple[Mapping[str, Any], ...]
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "assistant/chunk"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "turn": self.turn,
                "step": self.step,
                "attempt": self.attempt,
                "deltas": [dict(d) for d in self.deltas],
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> AssistantChunk:
        turn, step, attempt = f.req_int("turn"), f.req_int("step"), f.req_int("attempt")
        deltas = f.req_list("deltas")
        for i, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                raise ValueError(f"{f.where}.deltas[{i}] must be an object")
        return cls(turn, step, attempt, tuple(deltas), f.extra())


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """``assistant/message``: a finished reply, or (``interrupted``) the salvaged prefix of one.

    ``finish`` is ``stop``, ``tool_calls``, ``length`` or ``aborted``. A ``length`` reply's tool
    calls are not kept; their number is ``dropped_tool_calls``.
    """

    turn: int
    step: int
    message: AssistantReply
    finish: ReplyFinish
    usage: Mapping[str, Any] | None = None
    interrupted: bool = False
    dropped_tool_calls: int | None = None
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "assistant/message"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "turn": self.turn,
            "step": self.step,
            "message": self.message.to_json(),
            "finish": self.finish,
        }
        if self.usage is not None:
            out["usage"] = dict(self.usage)
        if self.interrupted:
            out["interrupted"] = True
        if self.dropped_tool_calls is not None:
            out["dropped_tool_calls"] = self.dropped_tool_calls
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> AssistantMessage:
        turn, step = f.req_int("turn"), f.req_int("step")
        message = AssistantReply.from_json(f.req_obj("message"), f"{f.where}.message")
        finish: Any = f.req_choice("finish", REPLY_FINISHES)
        usage = f.opt_obj("usage")
        interrupted = f.flag("interrupted")
        dropped = f.opt_int("dropped_tool_calls")
        return cls(turn, step, message, finish, usage, interrupted, dropped, f.extra())
