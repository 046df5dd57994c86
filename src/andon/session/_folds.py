"""Pure folds over a log: the model-visible history, consumed work, and the resumable state.

Each takes records as ``read()`` / ``iter_records()`` give them or plain dicts parsed from
``events.jsonl``, in one pass, holding no more than the current step (plus what it returns), so
``history(iter_records(dir))`` never holds the file. Dicts parsed from the output of
``andon run --json`` work too, and so do the values ``Agent.events()`` yields: live events (no
``seq``) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

from andon.session._events import ProjectInstructions
from andon.session._live import AgentEvent
from andon.session._reader import without_live_only
from andon.session._records import (
    AssistantChunk,
    AssistantMessage,
    ContextCompacted,
    ContextTrimmed,
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
    as_records,
)
from andon.session._values import (
    AssistantReply,
    Blocked,
    Completed,
    Interrupted,
    MaxTokens,
    ModelInfo,
    TurnAborted,
    TurnFailed,
    UserMessage,
)

__all__ = [
    "SUMMARY_HEADER",
    "ConsumedFold",
    "ConsumedWork",
    "SessionState",
    "StateFold",
    "fold_consumed_work",
    "fold_state",
    "history",
    "history_entries",
    "summary_message",
    "trimmed_stub",
]

Events = Iterable[AgentEvent | Mapping[str, Any]]


# --- history ------------------------------------------------------------------------------------


class _StepBuffer:
    """The model-visible items of one step, held until the step is over.

    A reply's tool calls are kept only if their result is in the step, and a result only if a
    reply of the step asked for it: the history is then always a valid request (no call without a
    result, no result without a call), even for a live step whose results are still coming.
    Every item carries the ``seq`` of the record it comes from (compaction cuts by it).
    """

    __slots__ = ("items", "results")

    def __init__(self) -> None:
        self.items: list[tuple[int, dict[str, Any] | AssistantReply]] = []
        self.results: dict[str, tuple[int, dict[str, Any]]] = {}

    def flush(self, out: list[tuple[int, dict[str, Any]]]) -> None:
        if not self.items and not self.results:
            return
        used: set[str] = set()
        for seq, item in self.items:
            if isinstance(item, dict):
                out.append((seq, item))
                continue
            calls = [
                c for c in item.tool_calls if c.call_id in self.results and c.call_id not in used
            ]
            text = item.text
            if not text and not calls:
                continue  # e.g. an interrupted prefix holding only reasoning: APIs reject it
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ]
            # On every assistant message, "" when it had none: the model adapter decides what to
            # send back (DeepSeek thinking mode needs it on every message of a tool-using span).
            message["reasoning_content"] = item.reasoning or ""
            out.append((seq, message))
            for c in calls:
                used.add(c.call_id)
                out.append(self.results[c.call_id])
        self.items.clear()
        self.results.clear()


SUMMARY_HEADER = (
    "[andon: the conversation between the first message and this point was compacted to fit the "
    "model's context window. A summary of it follows.]"
)
"""How a compaction summary is introduced to the model (docs/agent-loop.md, Compaction)."""


def trimmed_stub(result: ToolResult) -> str:
    """The one line a trimmed tool result shows the model instead of its content: where the full
    output is. Tools run with ``$ANDON_SESSION`` set to the session folder, so the model can read
    the file with the tools it has."""
    size = result.output_bytes if result.output_bytes is not None else len(result.content)
    if result.output_file is not None:
        where = f"the full output is in $ANDON_SESSION/{result.output_file}"
    else:
        where = "the session log keeps it"
    return (
        f"[andon: this output of call {result.call_id} ({size} bytes) was removed to fit the "
        f"model's context window; {where}]"
    )


def summary_message(summary: str) -> dict[str, Any]:
    """The user message a compaction summary becomes in the history."""
    return {"role": "user", "content": f"{SUMMARY_HEADER}\n\n{summary}"}


def history_entries(events: Events) -> list[tuple[int, dict[str, Any]]]:
    """:func:`history` with the ``seq`` of the record each message comes from (a summary's is its
    ``context/compacted`` record's). The compaction policy chooses its cut points by them."""
    out: list[tuple[int, dict[str, Any]]] = []
    step = _StepBuffer()
    first_user: tuple[int, dict[str, Any]] | None = None
    stubs: dict[str, str] = {}  # call id -> its stub, for a later context/trimmed
    for record in as_records(without_live_only(events)):
        data = record.data
        match data:
            case UserMessageEntered(message=message):
                said: dict[str, Any] = {"role": "user", "content": message.content}
                if first_user is None:
                    first_user = (record.seq, said)
                step.items.append((record.seq, said))
            case AssistantMessage(message=reply):
                step.items.append((record.seq, reply))
            case ToolResult(call_id=call_id, content=content):
                if call_id not in step.results:
                    answer = {"role": "tool", "tool_call_id": call_id, "content": content}
                    step.results[call_id] = (record.seq, answer)
                    stubs[call_id] = trimmed_stub(data)
            case ContextTrimmed(calls=calls):
                step.flush(out)
                trimmed = set(calls)
                out = [
                    (seq, {**m, "content": stubs[m["tool_call_id"]]})
                    if m.get("role") == "tool" and m.get("tool_call_id") in trimmed
                    else (seq, m)
                    for seq, m in out
                ]
            case ContextCompacted(kept_from=kept_from, summary=summary):
                step.flush(out)
                kept = [(seq, m) for seq, m in out if seq >= kept_from and (seq, m) != first_user]
                head = [first_user] if first_user is not None else []
                out = [*head, (record.seq, summary_message(summary)), *kept]
            case StepStart() | StepEnd() | TurnStart() | TurnEnd():
                step.flush(out)
            case (
                SessionStart()
                | SessionResumed()
                | SessionRepaired()
                | InboxSpliced()
                | LlmRequest()
                | LlmRetry()
                | AssistantChunk()
                | ToolCall()
                | ToolStarted()
                | ToolSignal()
                | McpServerEvent()
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)
    step.flush(out)
    return out


def history(events: Events) -> list[dict[str, Any]]:
    """The model-visible conversation as OpenAI chat messages (plain dicts).

    ``user/message`` → ``{"role": "user", "content"}``; ``assistant/message`` (interrupted prefixes
    included) → ``{"role": "assistant", "content": str | None, "tool_calls"?,
    "reasoning_content": str}`` (``""`` when the reply had no reasoning), left out when it has
    neither text nor tool calls; ``tool/result`` →
    ``{"role": "tool", "tool_call_id", "content"}``. Compaction applies as the log recorded it:
    after ``context/trimmed`` the named results read as a one-line stub, and after
    ``context/compacted`` everything before its cut but the first user message reads as one
    summary message. No system message: the adapter adds the system prompt in force. The result
    is always a valid request.
    """
    return [message for _, message in history_entries(events)]


# --- consumed work ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumedWork:
    """How the last piece of work that was consumed ended, and whether queued work was dropped.

    ``end`` is the accounting ``turn/end`` record (as a dict, exactly as on disk) or ``None``;
    ``dropped_unrun`` says queued work was discarded unrun after it.
    """

    end: dict[str, Any] | None
    dropped_unrun: bool


def fold_consumed_work(events: Events) -> ConsumedWork:
    """Single pass, as docs/log-format.md, What is derived from the log, describes.

    A splice with ``outcome: "canceled"``, a removal and nothing inserted sets ``dropped_unrun``;
    a claim (a splice without outcome removing items and inserting none, while a turn is open)
    marks the open turn as having claimed input; a ``turn/end`` becomes the accounting end if its
    turn had a step, or claimed input and ended blocked / aborted / interrupted / error; becoming
    the accounting end resets ``dropped_unrun``.
    """
    fold = ConsumedFold()
    for record in as_records(without_live_only(events)):
        fold.feed(record)
    return fold.result()


class ConsumedFold:
    """:func:`fold_consumed_work` one record at a time, with its state as JSON (the index of a
    long log keeps it, so a cold load folds only the records after it)."""

    __slots__ = ("claimed", "dropped", "end", "had_step", "open_turn")

    def __init__(self) -> None:
        self.end: Record | None = None
        self.dropped = False
        self.open_turn = False
        self.had_step = False
        self.claimed = False

    def feed(self, record: Record) -> None:
        data = record.data
        match data:
            case InboxSpliced(outcome=outcome, inserted=inserted):
                if data.removed > 0 and not inserted:
                    if outcome == "canceled":
                        self.dropped = True
                    elif outcome is None and self.open_turn:
                        self.claimed = True
            case TurnStart():
                self.open_turn, self.had_step, self.claimed = True, False, False
            case StepStart():
                self.had_step = True
            case TurnEnd(reason=reason):
                match reason:
                    case Blocked() | TurnAborted() | Interrupted() | TurnFailed():
                        gave_up = True
                    case Completed() | MaxTokens():
                        gave_up = False
                    case _:
                        assert_never(reason)
                if self.had_step or (self.claimed and gave_up):
                    self.end, self.dropped = record, False
                self.open_turn, self.had_step, self.claimed = False, False, False
            case (
                SessionStart()
                | SessionResumed()
                | SessionRepaired()
                | StepEnd()
                | UserMessageEntered()
                | LlmRequest()
                | LlmRetry()
                | AssistantChunk()
                | AssistantMessage()
                | ToolCall()
                | ToolStarted()
                | ToolSignal()
                | ToolResult()
                | ContextTrimmed()
                | ContextCompacted()
                | McpServerEvent()
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)

    def result(self) -> ConsumedWork:
        return ConsumedWork(None if self.end is None else self.end.to_dict(), self.dropped)

    def to_json(self) -> dict[str, Any]:
        return {
            "end": None if self.end is None else self.end.to_dict(),
            "flags": [self.dropped, self.open_turn, self.had_step, self.claimed],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ConsumedFold:
        fold = cls()
        end = obj["end"]
        fold.end = None if end is None else Record.from_dict(end)
        flags = obj["flags"]
        if len(flags) != 4 or not all(isinstance(f, bool) for f in flags):
            raise TypeError("the flags are not four booleans")
        fold.dropped, fold.open_turn, fold.had_step, fold.claimed = flags
        return fold


# --- state --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionState:
    """Where a session stands: what a resume continues from.

    ``next_turn`` / ``next_step`` are the pending inbox lists replayed from the splices (each
    ``next_turn`` item is one future turn; all ``next_step`` items enter the next step).
    """

    session_id: str | None
    last_turn: int
    open_turn: int | None
    open_step: int | None
    next_turn: tuple[UserMessage, ...]
    next_step: tuple[UserMessage, ...]
    next_seq: int
    model: ModelInfo | None
    system_prompt: str | None
    project_instructions: ProjectInstructions | None = None
    """Those the last ``session/*`` record added to ``system_prompt`` (None: none)."""

    @property
    def base_system_prompt(self) -> str | None:
        """``system_prompt`` without the project instructions at its end: the text a resume
        adds the instructions it reads again to (docs/agent-loop.md, Project instructions)."""
        prompt, added = self.system_prompt, self.project_instructions
        if prompt is None or added is None or not 0 < added.chars <= len(prompt):
            return prompt
        return prompt[: len(prompt) - added.chars]


def fold_state(events: Events) -> SessionState:
    """Last turn number, open turn and step, pending inbox, and the model and prompt in force.

    A splice on list ``target`` removes ``removed_count`` items at ``start`` and inserts
    ``inserted`` there (a ``start`` past the end appends).
    """
    fold = StateFold()
    for record in as_records(without_live_only(events)):
        fold.feed(record)
    return fold.result()


class StateFold:
    """:func:`fold_state` one record at a time, with its state as JSON (the index of a long log
    keeps it, so a cold load folds only the records after it)."""

    __slots__ = (
        "inbox",
        "instructions",
        "last_turn",
        "model",
        "next_seq",
        "open_step",
        "open_turn",
        "prompt",
        "session_id",
    )

    def __init__(self) -> None:
        self.session_id: str | None = None
        self.model: ModelInfo | None = None
        self.prompt: str | None = None
        self.instructions: ProjectInstructions | None = None
        self.last_turn = 0
        self.open_turn: int | None = None
        self.open_step: int | None = None
        self.inbox: dict[str, list[UserMessage]] = {"next-turn": [], "next-step": []}
        self.next_seq = 0

    def feed(self, record: Record) -> None:
        self.next_seq = record.seq + 1
        data = record.data
        match data:
            case SessionStart():
                self.session_id, self.model = data.session_id, data.model
                self.prompt, self.instructions = data.system_prompt, data.project_instructions
            case SessionResumed():
                self.model, self.prompt = data.model, data.system_prompt
                self.instructions = data.project_instructions
            case InboxSpliced(target=target, start=start, inserted=inserted):
                items = self.inbox[target]
                items[start : start + data.removed] = inserted
            case TurnStart(turn=turn):
                self.open_turn, self.open_step = turn, None
                self.last_turn = max(self.last_turn, turn)
            case TurnEnd():
                self.open_turn, self.open_step = None, None
            case StepStart(step=step):
                self.open_step = step
            case StepEnd():
                self.open_step = None
            case (
                SessionRepaired()
                | UserMessageEntered()
                | LlmRequest()
                | LlmRetry()
                | AssistantChunk()
                | AssistantMessage()
                | ToolCall()
                | ToolStarted()
                | ToolSignal()
                | ToolResult()
                | ContextTrimmed()
                | ContextCompacted()
                | McpServerEvent()
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)

    def result(self) -> SessionState:
        return SessionState(
            self.session_id,
            self.last_turn,
            self.open_turn,
            self.open_step,
            tuple(self.inbox["next-turn"]),
            tuple(self.inbox["next-step"]),
            self.next_seq,
            self.model,
            self.prompt,
            self.instructions,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "model": None if self.model is None else self.model.to_json(),
            "prompt": self.prompt,
            "instructions": None if self.instructions is None else self.instructions.to_json(),
            "last_turn": self.last_turn,
            "open_turn": self.open_turn,
            "open_step": self.open_step,
            "inbox": {k: [m.to_json() for m in v] for k, v in self.inbox.items()},
            "next_seq": self.next_seq,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> StateFold:
        fold = cls()
        fold.session_id = _opt(obj["session_id"], str)
        model, added = obj["model"], obj["instructions"]
        fold.model = None if model is None else ModelInfo.from_json(model)
        fold.prompt = _opt(obj["prompt"], str)
        fold.instructions = None if added is None else ProjectInstructions.from_json(added)
        fold.last_turn = _the(obj["last_turn"], int)
        fold.open_turn = _opt(obj["open_turn"], int)
        fold.open_step = _opt(obj["open_step"], int)
        inbox = obj["inbox"]
        fold.inbox = {k: [UserMessage.from_json(m) for m in inbox[k]] for k in fold.inbox}
        fold.next_seq = _the(obj["next_seq"], int)
        return fold


_V = TypeVar("_V")


def _the(value: object, kind: type[_V]) -> _V:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a {kind.__name__}")
    return value


def _opt(value: object, kind: type[_V]) -> _V | None:
    return None if value is None else _the(value, kind)
