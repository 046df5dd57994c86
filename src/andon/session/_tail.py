"""What is open at the end of a log, and the records that close it.

Two writers need this and must agree: crash repair (closing a cold log whose process died) and the
live writer after a failed append (closing its own turn with ``LOG_WRITE_FAILED``). Both close in
the same order, because the invariants demand it:

1. every tool call of the open step that has no result gets one, **in model order** (the order of
   the step's last ``assistant/message``, then any other ``tool/call`` in log order): a call whose
   ``tool/call`` is on disk may have run, so its outcome is unknown; a call without one never
   started (``tool/call`` is made durable before any tool body is dispatched);
2. ``step/end`` — before ``turn/end``, since a ``turn/end`` with an open step breaks invariant 2;
3. ``turn/end`` with the given reason.

No assistant message is ever written here: a reply that was streaming when the process stopped is
not reconstructed from its chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, assert_never

from andon.base import ErrorCode
from andon.session._records import (
    AssistantChunk,
    AssistantMessage,
    ContextCompacted,
    ContextTrimmed,
    EventData,
    InboxSpliced,
    LlmRequest,
    LlmRetry,
    McpServerEvent,
    Record,
    SessionRepaired,
    SessionResumed,
    SessionStart,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnEnd,
    TurnStart,
    Unrecognized,
    UserMessageEntered,
)
from andon.session._values import ToolCallBlock, ToolErrorInfo, TurnEndReason

__all__ = ["ClosingTexts", "Dangling", "OpenStep", "Tail", "closing_data"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Link(Generic[_T]):
    """One cell of a persistent list, newest first: adding is O(1) and shares the rest."""

    item: _T
    rest: _Link[_T] | None


def _oldest_first(chain: _Link[_T] | None) -> list[_T]:
    out: list[_T] = []
    while chain is not None:
        out.append(chain.item)
        chain = chain.rest
    out.reverse()
    return out


@dataclass(frozen=True, slots=True)
class OpenStep:
    """The open step and the tool calls that still owe a result.

    A value: :meth:`Tail.feed` replaces it, never changes it in place, so two tails can share one
    and a tail is copied shallowly (:meth:`Tail.fed`). What it collects (calls, starts, answers)
    is kept in persistent lists, so that feeding a record costs O(1) however many calls the step
    has: a step of 10,000 calls once cost a copy of every collection per record, quadratic, which
    made writing a stopped step's 20,000 records take seconds. The lists are read only when the
    step is closed (:meth:`Tail.dangling`).
    """

    turn: int
    step: int
    requested: tuple[ToolCallBlock, ...] = ()
    calls: _Link[ToolCall] | None = None
    started: _Link[ToolStarted] | None = None
    answered: _Link[str] | None = None

    def with_call(self, call: ToolCall) -> OpenStep:
        return OpenStep(
            self.turn, self.step, self.requested, _Link(call, self.calls), self.started,
            self.answered,
        )  # fmt: skip

    def with_started(self, started: ToolStarted) -> OpenStep:
        return OpenStep(
            self.turn, self.step, self.requested, self.calls, _Link(started, self.started),
            self.answered,
        )  # fmt: skip

    def with_answer(self, call_id: str) -> OpenStep:
        return OpenStep(
            self.turn, self.step, self.requested, self.calls, self.started,
            _Link(call_id, self.answered),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Dangling:
    """A tool call of the open step without a result."""

    call_id: str
    name: str
    called: bool
    """Whether its ``tool/call`` is on disk (then it may have run: outcome unknown)."""
    started: tuple[ToolStarted, ...]


class Tail:
    """An incremental fold that keeps only what closing a log needs: O(1) per record (a tool
    call's records included, however many calls its step has).

    Deliberately forgiving: it follows what the records say even where they break an invariant
    (``check`` is the strict reader); it must never refuse to close a log.
    """

    __slots__ = ("last_time", "last_turn", "next_seq", "open_turn", "session_id", "step")

    def __init__(self) -> None:
        self.next_seq = 0
        self.last_time = 0.0
        self.last_turn = 0
        self.open_turn: int | None = None
        self.step: OpenStep | None = None
        self.session_id: str | None = None  # half of every call's process tag

    @property
    def balanced(self) -> bool:
        """No open turn and no open step."""
        return self.open_turn is None and self.step is None

    def fed(self, record: Record) -> Tail:
        """A new tail: this one with ``record`` fed, this one left exactly as it was.

        The live writer computes the tail after an append this way before it writes, so that
        committing the append is one attribute store (see ``SessionLog``).
        """
        new = Tail()
        # Every slot holds a value feeding replaces, never changes (the open step included).
        new.last_time = self.last_time
        new.last_turn = self.last_turn
        new.open_turn = self.open_turn
        new.step = self.step
        new.session_id = self.session_id
        new.feed(record)  # sets next_seq
        return new

    def feed(self, record: Record) -> None:
        self.next_seq = record.seq + 1
        self.last_time = record.time
        step = self.step
        match record.data:
            case TurnStart(turn=turn):
                self.open_turn = turn
                self.last_turn = max(self.last_turn, turn)
                self.step = None
            case TurnEnd():
                self.open_turn = None
                self.step = None
            case StepStart(turn=turn, step=number):
                self.step = OpenStep(turn, number)
            case StepEnd():
                self.step = None
            case AssistantMessage(message=reply, interrupted=interrupted):
                # Only the step's last reply counts (docs/log-format.md, Replies); an
                # interrupted prefix asks for nothing, whatever it holds.
                if step is not None and not interrupted:
                    self.step = replace(step, requested=reply.tool_calls)
            case ToolCall() as call:
                if step is not None:
                    self.step = step.with_call(call)
            case ToolStarted() as started:
                if step is not None:
                    self.step = step.with_started(started)
            case ToolResult(call_id=call_id):
                if step is not None:
                    self.step = step.with_answer(call_id)
            case SessionStart(session_id=session_id):
                self.session_id = session_id
            case (
                SessionResumed()
                | SessionRepaired()
                | InboxSpliced()
                | UserMessageEntered()
                | LlmRequest()
                | LlmRetry()
                | AssistantChunk()
                | ToolSignal()
                | ContextTrimmed()
                | ContextCompacted()
                | McpServerEvent()
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(record.data)

    def to_json(self) -> dict[str, Any]:
        """What this tail holds, as JSON: the index of a long log keeps it (``_index``)."""
        step = self.step
        return {
            "next_seq": self.next_seq,
            "last_time": self.last_time,
            "last_turn": self.last_turn,
            "open_turn": self.open_turn,
            "session_id": self.session_id,
            "step": None
            if step is None
            else {
                "turn": step.turn,
                "step": step.step,
                "requested": [block.to_json() for block in step.requested],
                "calls": [call.to_json() for call in _oldest_first(step.calls)],
                "started": [run.to_json() for run in _oldest_first(step.started)],
                "answered": _oldest_first(step.answered),
            },
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Tail:
        """The tail :meth:`to_json` gave; ``ValueError``/``KeyError``/``TypeError`` if it is not
        one (the index is then ignored)."""
        tail = cls()
        tail.next_seq = _int(obj["next_seq"])
        tail.last_time = float(obj["last_time"])
        tail.last_turn = _int(obj["last_turn"])
        tail.open_turn = _opt_int(obj["open_turn"])
        session_id = obj["session_id"]
        if session_id is not None and not isinstance(session_id, str):
            raise TypeError("session_id is not a string")
        tail.session_id = session_id
        step = obj["step"]
        if step is not None:
            calls: _Link[ToolCall] | None = None
            for call in step["calls"]:
                calls = _Link(ToolCall.from_json(call), calls)
            started: _Link[ToolStarted] | None = None
            for run in step["started"]:
                started = _Link(ToolStarted.from_json(run), started)
            answered: _Link[str] | None = None
            for call_id in step["answered"]:
                if not isinstance(call_id, str):
                    raise TypeError("a call id is not a string")
                answered = _Link(call_id, answered)
            requested = tuple(ToolCallBlock.from_json(b) for b in step["requested"])
            tail.step = OpenStep(
                _int(step["turn"]), _int(step["step"]), requested, calls, started, answered
            )
        return tail

    def dangling(self) -> list[Dangling]:
        """The open step's calls that owe a result, in model order."""
        step = self.step
        if step is None:
            return []
        answered = set(_oldest_first(step.answered))
        calls: dict[str, ToolCall] = {}
        for call in _oldest_first(step.calls):
            calls[call.call_id] = call  # a repeated id keeps its first place, its last record
        started: dict[str, list[ToolStarted]] = {}
        for run in _oldest_first(step.started):
            started.setdefault(run.call_id, []).append(run)
        out: list[Dangling] = []
        seen: set[str] = set()
        for block in step.requested:
            if block.call_id in answered or block.call_id in seen:
                continue
            seen.add(block.call_id)
            out.append(
                Dangling(
                    block.call_id,
                    block.name,
                    block.call_id in calls,
                    tuple(started.get(block.call_id, ())),
                )
            )
        # A tool/call the reply does not list (never written by andon, but possible in a log from
        # elsewhere) still owes its result: invariant 5 holds for every tool/call.
        for call_id, call in calls.items():
            if call_id in answered or call_id in seen:
                continue
            seen.add(call_id)
            out.append(Dangling(call_id, call.name, True, tuple(started.get(call_id, ()))))
        return out


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


@dataclass(frozen=True, slots=True)
class ClosingTexts:
    """What a closing result tells the model, per case (crash repair and write failure differ)."""

    error_name: str
    unknown_message: str
    unknown_content: str
    not_started_message: str
    not_started_content: str


def closing_data(tail: Tail, reason: TurnEndReason, texts: ClosingTexts) -> list[EventData]:
    """The records that close whatever ``tail`` has open, in the order the invariants require."""
    out: list[EventData] = []
    step = tail.step
    if step is not None:
        for d in tail.dangling():
            if d.called:
                out.append(
                    ToolResult(
                        step.turn,
                        step.step,
                        d.call_id,
                        texts.unknown_content,
                        True,
                        0.0,
                        error=ToolErrorInfo(
                            texts.error_name,
                            ErrorCode.TOOL_OUTCOME_UNKNOWN.value,
                            texts.unknown_message,
                        ),
                    )
                )
            else:
                out.append(
                    ToolResult(
                        step.turn,
                        step.step,
                        d.call_id,
                        texts.not_started_content,
                        True,
                        0.0,
                        error=ToolErrorInfo(
                            texts.error_name,
                            ErrorCode.TOOL_NOT_STARTED.value,
                            texts.not_started_message,
                        ),
                        ended_by="not-run",
                    )
                )
        out.append(StepEnd(step.turn, step.step))
    if tail.open_turn is not None:
        out.append(TurnEnd(tail.open_turn, reason))
    return out
