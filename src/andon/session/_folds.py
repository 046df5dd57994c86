"""Pure folds over a log: the model-visible history, consumed work, and the resumable state.

Each takes records as ``read()`` / ``iter_records()`` give them or plain dicts parsed from
``events.jsonl``, in one pass, holding no more than the current step (plus what it returns), so
``history(iter_records(dir))`` never holds the file. Dicts parsed from the output of
``andon run --json`` work too: its live-only lines (no ``seq``) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from andon.session._events import ProjectInstructions
from andon.session._reader import without_live_only
from andon.session._records import (
    AssistantChunk,
    AssistantMessage,
    InboxSpliced,
    LlmRequest,
    LlmRetry,
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

__all__ = ["ConsumedWork", "SessionState", "fold_consumed_work", "fold_state", "history"]

Events = Iterable[Record | Mapping[str, Any]]


# --- history ------------------------------------------------------------------------------------


class _StepBuffer:
    """The model-visible items of one step, held until the step is over.

    A reply's tool calls are kept only if their result is in the step, and a result only if a
    reply of the step asked for it: the history is then always a valid request (no call without a
    result, no result without a call), even for a live step whose results are still coming.
    """

    __slots__ = ("items", "results")

    def __init__(self) -> None:
        self.items: list[dict[str, Any] | AssistantReply] = []
        self.results: dict[str, dict[str, Any]] = {}

    def flush(self, out: list[dict[str, Any]]) -> None:
        if not self.items and not self.results:
            return
        used: set[str] = set()
        for item in self.items:
            if isinstance(item, dict):
                out.append(item)
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
            out.append(message)
            for c in calls:
                used.add(c.call_id)
                out.append(self.results[c.call_id])
        self.items.clear()
        self.results.clear()


def history(events: Events) -> list[dict[str, Any]]:
    """The model-visible conversation as OpenAI chat messages (plain dicts).

    ``user/message`` → ``{"role": "user", "content"}``; ``assistant/message`` (interrupted prefixes
    included) → ``{"role": "assistant", "content": str | None, "tool_calls"?,
    "reasoning_content": str}`` (``""`` when the reply had no reasoning), left out when it has
    neither text nor tool calls; ``tool/result`` →
    ``{"role": "tool", "tool_call_id", "content"}``. No system message: the adapter adds the system
    prompt in force. The result is always a valid request.
    """
    out: list[dict[str, Any]] = []
    step = _StepBuffer()
    for record in as_records(without_live_only(events)):
        data = record.data
        match data:
            case UserMessageEntered(message=message):
                step.items.append({"role": "user", "content": message.content})
            case AssistantMessage(message=reply):
                step.items.append(reply)
            case ToolResult(call_id=call_id, content=content):
                step.results.setdefault(
                    call_id, {"role": "tool", "tool_call_id": call_id, "content": content}
                )
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
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)
    step.flush(out)
    return out


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
    end: Record | None = None
    dropped = False
    open_turn = False
    had_step = False
    claimed = False
    for record in as_records(without_live_only(events)):
        data = record.data
        match data:
            case InboxSpliced(outcome=outcome, inserted=inserted):
                if data.removed > 0 and not inserted:
                    if outcome == "canceled":
                        dropped = True
                    elif outcome is None and open_turn:
                        claimed = True
            case TurnStart():
                open_turn, had_step, claimed = True, False, False
            case StepStart():
                had_step = True
            case TurnEnd(reason=reason):
                match reason:
                    case Blocked() | TurnAborted() | Interrupted() | TurnFailed():
                        gave_up = True
                    case Completed() | MaxTokens():
                        gave_up = False
                    case _:
                        assert_never(reason)
                if had_step or (claimed and gave_up):
                    end, dropped = record, False
                open_turn, had_step, claimed = False, False, False
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
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)
    return ConsumedWork(None if end is None else end.to_dict(), dropped)


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
    session_id: str | None = None
    model: ModelInfo | None = None
    prompt: str | None = None
    instructions: ProjectInstructions | None = None
    last_turn = 0
    open_turn: int | None = None
    open_step: int | None = None
    inbox: dict[str, list[UserMessage]] = {"next-turn": [], "next-step": []}
    next_seq = 0
    for record in as_records(without_live_only(events)):
        next_seq = record.seq + 1
        data = record.data
        match data:
            case SessionStart():
                session_id, model, prompt = data.session_id, data.model, data.system_prompt
                instructions = data.project_instructions
            case SessionResumed():
                model, prompt = data.model, data.system_prompt
                instructions = data.project_instructions
            case InboxSpliced(target=target, start=start, inserted=inserted):
                items = inbox[target]
                items[start : start + data.removed] = inserted
            case TurnStart(turn=turn):
                open_turn, open_step = turn, None
                last_turn = max(last_turn, turn)
            case TurnEnd():
                open_turn, open_step = None, None
            case StepStart(step=step):
                open_step = step
            case StepEnd():
                open_step = None
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
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)
    return SessionState(
        session_id,
        last_turn,
        open_turn,
        open_step,
        tuple(inbox["next-turn"]),
        tuple(inbox["next-step"]),
        next_seq,
        model,
        prompt,
        instructions,
    )
