"""The rules of docs/log-format.md (The rules a log always keeps), checked in one pass over a log.

1. ``seq`` is contiguous from 0; the first record is ``session/start``.
2. Turns do not nest; ``turn/start`` carries the next number; every ``turn/start`` is matched by
   exactly one ``turn/end`` naming it; ``turn/end`` requires no open step.
3. Steps live inside a turn, do not nest, are numbered 1, 2, … within the turn; ``step/end``
   names the open step.
4. ``user/message``, ``llm/*``, ``assistant/*`` and ``tool/*`` name the open turn and step.
5. Every ``tool/call`` has exactly one ``tool/result`` with its ``call_id`` in the same step,
   before ``step/end``; results appear in model order; ``tool/started`` and ``tool/signal`` come
   between a call and its result; the one result allowed without a ``tool/call`` is a repair result
   with code ``TOOL_NOT_STARTED``; ``call_id``\\ s are unique in the session. (Also: every tool call
   an assistant message asks for is answered in its step, since the history sent to the model
   needs a result for each; and a ``tool/call`` answers a call the step's reply asked for.)
6. Between turns only ``agent/inbox/spliced``, ``session/*`` and ignorable records appear.
7. An ``assistant/message`` with ``interrupted: true`` holds only text and reasoning blocks with
   non-whitespace content, never tool calls.
8. Compaction records (``context/*``) name the open turn and step and come before the step's
   reply, or, naming neither, stand between turns. ``context/trimmed`` names only calls answered
   in an earlier step; ``context/compacted`` cuts at a ``step/start`` later than the previous
   compaction and before itself.
9. ``project_instructions`` of ``session/start`` and ``session/resumed`` names at least one file,
   each by a relative path below its root (``/``-separated, no ``..``) with a SHA-256 of 64
   lower-case hex digits, and its ``chars`` are the end of the record's ``system_prompt``.

A live session may end with one open turn and step (``live=True``); a cold, repaired log may not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never, final

from andon.base import ErrorCode
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
from andon.session._values import ReasoningBlock, TextBlock, ToolCallBlock

__all__ = ["InvariantViolation", "check"]

_SHA256 = re.compile("[0-9a-f]{64}")


@final
@dataclass(frozen=True, slots=True)
class InvariantViolation:
    """One broken invariant: the record (``seq``) where it shows, the rule number, and why."""

    seq: int
    rule: int
    message: str

    def __str__(self) -> str:
        return f"seq {self.seq}: invariant {self.rule}: {self.message}"


@dataclass(slots=True)
class _Step:
    turn: int
    step: int
    seq: int
    replied: bool = False
    # call_id -> position in model order (the order the step's replies list them)
    requested: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # call_id -> seq of its tool/call
    answered: set[str] = field(default_factory=set)
    last_order: int = -1
    last_answered: str | None = None


class _Checker:
    def __init__(self, live: bool) -> None:
        self.live = live
        self.out: list[InvariantViolation] = []
        self.expected_seq = 0
        self.seen_first = False
        self.last_turn = 0
        self.turn: int | None = None
        self.turn_seq = 0
        self.last_step = 0
        self.step: _Step | None = None
        self.call_ids: set[str] = set()
        self.last_seq = -1
        # The seqs of step/start records since the last compaction: a compaction's cut must be
        # one of them (one at or before the last compaction is reported as such), so the set is
        # emptied at each compaction and a long session that compacts holds few.
        self.step_starts: set[int] = set()
        # The call ids no ended step answered: those of the open step, and any a step left
        # unanswered. A call is "answered in a step that has ended" (what context/trimmed may
        # name) when it is in call_ids and not here: the complement of a small set, instead of
        # a second set as large as call_ids.
        self.unclosed: set[str] = set()
        self.last_compaction = -1

    def bad(self, seq: int, rule: int, message: str) -> None:
        self.out.append(InvariantViolation(seq, rule, message))

    def feed(self, r: Record) -> None:
        seq = r.seq
        self.last_seq = seq
        if seq != self.expected_seq:
            self.bad(
                seq,
                1,
                f"seq {seq} follows seq {self.expected_seq - 1}; seq must be contiguous "
                f"from 0 (expected {self.expected_seq})",
            )
        self.expected_seq = seq + 1
        if not self.seen_first:
            self.seen_first = True
            if not isinstance(r.data, SessionStart):
                self.bad(
                    seq, 1, f"the log starts with {r.type}; the first record must be session/start"
                )
        data = r.data
        match data:
            case SessionStart() | SessionResumed() | SessionRepaired():
                self._session_record(r)
            case InboxSpliced() | McpServerEvent() | Unrecognized():
                pass
            case TurnStart(turn=n):
                self._turn_start(seq, n)
            case TurnEnd(turn=n):
                self._turn_end(seq, n)
            case StepStart(turn=t, step=s):
                self._step_start(seq, t, s)
            case StepEnd(turn=t, step=s):
                self._step_end(seq, t, s)
            case AssistantMessage():
                if self._in_step(r, data.turn, data.step):
                    self._reply(seq, data)
            case ToolCall(call_id=call_id):
                if self._in_step(r, data.turn, data.step):
                    self._call(seq, call_id)
            case ToolStarted(call_id=call_id) | ToolSignal(call_id=call_id):
                if self._in_step(r, data.turn, data.step):
                    self._between(seq, r.type, call_id)
            case ToolResult():
                if self._in_step(r, data.turn, data.step):
                    self._result(seq, data)
            case UserMessageEntered() | LlmRequest() | LlmRetry() | AssistantChunk():
                self._in_step(r, data.turn, data.step)
            case ContextTrimmed() | ContextCompacted():
                self._context(r, data)
            case _:
                assert_never(data)

    # --- 8: compaction ------------------------------------------------------------------------

    def _context(self, r: Record, data: ContextTrimmed | ContextCompacted) -> None:
        seq = r.seq
        if data.turn is None and data.step is None:
            if self.turn is not None:
                self.bad(
                    seq,
                    8,
                    f"{r.type} names no step while turn {self.turn} is open; inside a "
                    "turn it names the open turn and step",
                )
        elif data.turn is None or data.step is None:
            self.bad(seq, 8, f"{r.type} names a turn or a step without the other")
        elif self._in_step(r, data.turn, data.step):
            assert self.step is not None
            if self.step.replied:
                self.bad(seq, 8, f"{r.type} after the step's reply; compaction comes before it")
        if isinstance(data, ContextTrimmed):
            for call_id in data.calls:
                if call_id not in self.call_ids or call_id in self.unclosed:
                    self.bad(
                        seq, 8, f"context/trimmed names {call_id}, which no earlier step answered"
                    )
            return
        if data.kept_from <= self.last_compaction:
            self.bad(
                seq,
                8,
                f"context/compacted keeps from seq {data.kept_from}, before the previous "
                f"compaction (seq {self.last_compaction}) which it would undo",
            )
        elif data.kept_from not in self.step_starts or data.kept_from >= seq:
            self.bad(
                seq,
                8,
                f"context/compacted keeps from seq {data.kept_from}, which is no earlier "
                "step/start",
            )
        self.last_compaction = seq
        self.step_starts.clear()  # every one is at or before this compaction now

    # --- 1, 6: session records ----------------------------------------------------------------

    def _session_record(self, r: Record) -> None:
        if isinstance(r.data, SessionStart | SessionResumed):
            added = r.data.project_instructions
            if added is not None:
                self._instructions(r, added, r.data.system_prompt)
        if isinstance(r.data, SessionStart) and r.seq != 0:
            self.bad(r.seq, 1, "session/start appears again; a session starts once, at seq 0")
        if self.turn is not None and not isinstance(r.data, SessionStart):
            self.bad(
                r.seq,
                2,
                f"{r.type} while turn {self.turn} is open; a session is taken over "
                "or repaired only after its turns are closed",
            )

    # --- 8: project instructions ------------------------------------------------------------

    def _instructions(self, r: Record, added: ProjectInstructions, prompt: str) -> None:
        where = f"{r.type} project_instructions"
        if not added.files:
            self.bad(r.seq, 9, f"{where} names no file (it is left out when none were added)")
        for n, f in enumerate(added.files):
            parts = f.path.split("/")
            if f.path.startswith("/") or not f.path or ".." in parts or "" in parts:
                self.bad(
                    r.seq,
                    9,
                    f"{where}.files[{n}].path {f.path!r} is not a relative path below the root",
                )
            if _SHA256.fullmatch(f.sha256) is None:
                self.bad(
                    r.seq,
                    9,
                    f"{where}.files[{n}].sha256 {f.sha256[:80]!r} is not 64 lower-case hex digits",
                )
        if not 0 < added.chars <= len(prompt):
            self.bad(
                r.seq,
                9,
                f"{where}.chars is {added.chars}, but the instructions are the end of a "
                f"system_prompt of {len(prompt)} characters",
            )

    # --- 2: turns -------------------------------------------------------------------------------

    def _turn_start(self, seq: int, n: int) -> None:
        if self.turn is not None:
            self.bad(
                seq,
                2,
                f"turn/start {n} while turn {self.turn} is still open; turns do not "
                f"nest (turn {self.turn} never ended)",
            )
            self.step = None
        if n != self.last_turn + 1:
            self.bad(
                seq,
                2,
                f"turn/start {n} after turn {self.last_turn}; turns are numbered "
                f"1, 2, … so the next is {self.last_turn + 1}",
            )
        self.turn, self.turn_seq, self.last_step = n, seq, 0
        self.last_turn = max(self.last_turn, n)

    def _turn_end(self, seq: int, n: int) -> None:
        if self.turn is None:
            self.bad(seq, 2, f"turn/end {n} with no turn open; every turn ends exactly once")
            return
        if n != self.turn:
            self.bad(seq, 2, f"turn/end names turn {n} but the open turn is {self.turn}")
        if self.step is not None:
            self.bad(
                seq,
                2,
                f"turn/end {n} while step {self.step.turn}.{self.step.step} is still "
                "open; the step must end first",
            )
            self._close_step(seq)
        self.turn = None

    # --- 3: steps -------------------------------------------------------------------------------

    def _step_start(self, seq: int, t: int, s: int) -> None:
        if self.turn is None:
            self.bad(seq, 3, f"step/start {t}.{s} outside any turn; steps live inside a turn")
            return
        if t != self.turn:
            self.bad(seq, 3, f"step/start names turn {t} but the open turn is {self.turn}")
        if self.step is not None:
            self.bad(
                seq,
                3,
                f"step/start {t}.{s} while step {self.step.turn}.{self.step.step} is "
                "still open; steps do not nest",
            )
            self._close_step(seq)
        if s != self.last_step + 1:
            self.bad(
                seq,
                3,
                f"step {s} follows step {self.last_step} in turn {self.turn}; steps "
                f"are numbered 1, 2, … so the next is {self.last_step + 1}",
            )
        self.last_step = max(self.last_step, s)
        self.step = _Step(self.turn, s, seq)
        self.step_starts.add(seq)

    def _step_end(self, seq: int, t: int, s: int) -> None:
        if self.step is None:
            where = f"turn {self.turn}" if self.turn is not None else "no turn"
            self.bad(seq, 3, f"step/end {t}.{s} with no step open ({where} is open)")
            return
        if (t, s) != (self.step.turn, self.step.step):
            self.bad(
                seq,
                3,
                f"step/end names step {t}.{s} but the open step is "
                f"{self.step.turn}.{self.step.step}",
            )
        self._close_step(seq)

    def _close_step(self, seq: int) -> None:
        step = self.step
        assert step is not None
        name = f"{step.turn}.{step.step}"
        for call_id in step.calls:
            if call_id not in step.answered:
                self.bad(seq, 5, f"tool/call {call_id} has no tool/result before step {name} ends")
        for call_id in step.requested:
            if call_id not in step.answered and call_id not in step.calls:
                self.bad(
                    seq,
                    5,
                    f"the reply in step {name} asked for tool call {call_id}, but the "
                    "step ends without a tool/result for it",
                )
        self.unclosed.difference_update(step.answered)
        self.step = None

    # --- 4, 6: records that belong to a step ----------------------------------------------------

    def _in_step(self, r: Record, t: int, s: int) -> bool:
        if self.turn is None:
            self.bad(
                r.seq,
                6,
                f"{r.type} between turns; only agent/inbox/spliced, session/* and "
                "ignorable records may appear there",
            )
            return False
        if self.step is None:
            self.bad(r.seq, 4, f"{r.type} in turn {self.turn} outside any step")
            return False
        if (t, s) != (self.step.turn, self.step.step):
            self.bad(
                r.seq,
                4,
                f"{r.type} names step {t}.{s} but the open step is "
                f"{self.step.turn}.{self.step.step}",
            )
            return False
        return True

    # --- 5, 7: replies and tool calls -----------------------------------------------------------

    def _reply(self, seq: int, data: AssistantMessage) -> None:
        step = self.step
        assert step is not None
        step.replied = True
        if data.interrupted:
            for block in data.message.content:
                match block:
                    case ToolCallBlock(call_id=call_id):
                        self.bad(
                            seq,
                            7,
                            f"the interrupted reply holds tool call {call_id}; an "
                            "interrupted prefix keeps only text and reasoning",
                        )
                    case TextBlock(text=text) | ReasoningBlock(text=text):
                        if not text.strip():
                            self.bad(
                                seq,
                                7,
                                f"the interrupted reply keeps an empty {block.kind} "
                                "block; only blocks with visible content are kept",
                            )
                    case _:
                        assert_never(block)
            return  # it asks for nothing: its calls must not be answered either
        for block in data.message.tool_calls:
            if block.call_id in step.requested:
                self.bad(
                    seq,
                    5,
                    f"call_id {block.call_id} appears twice in the replies of step "
                    f"{step.turn}.{step.step}",
                )
                continue
            step.requested[block.call_id] = len(step.requested)

    def _call(self, seq: int, call_id: str) -> None:
        step = self.step
        assert step is not None
        if call_id in self.call_ids:
            self.bad(seq, 5, f"call_id {call_id} was used before; call ids are unique in a session")
            return
        self.call_ids.add(call_id)
        self.unclosed.add(call_id)
        step.calls[call_id] = seq
        if not step.replied:
            self.bad(
                seq,
                5,
                f"tool/call {call_id} comes before any reply of step "
                f"{step.turn}.{step.step} asked for it",
            )
        elif call_id not in step.requested:
            self.bad(
                seq,
                5,
                f"tool/call {call_id} is not one of the tool calls the reply of step "
                f"{step.turn}.{step.step} asked for",
            )

    def _between(self, seq: int, type_: str, call_id: str) -> None:
        step = self.step
        assert step is not None
        if call_id not in step.calls:
            self.bad(seq, 5, f"{type_} for {call_id}, which has no tool/call in this step")
        elif call_id in step.answered:
            self.bad(
                seq,
                5,
                f"{type_} for {call_id} after its tool/result; it belongs between the "
                "call and its result",
            )

    def _result(self, seq: int, data: ToolResult) -> None:
        step = self.step
        assert step is not None
        call_id = data.call_id
        if call_id in step.answered:
            self.bad(seq, 5, f"a second tool/result for {call_id}; every call has exactly one")
            return
        if call_id not in step.calls:
            code = data.error.code if data.error is not None else None
            if code != ErrorCode.TOOL_NOT_STARTED:
                self.bad(
                    seq,
                    5,
                    f"tool/result {call_id} has no tool/call in this step (only a "
                    "repair result with code TOOL_NOT_STARTED may stand alone)",
                )
                return
            if call_id in self.call_ids:
                self.bad(
                    seq, 5, f"call_id {call_id} was used before; call ids are unique in a session"
                )
                return
            self.call_ids.add(call_id)
            self.unclosed.add(call_id)
            if call_id not in step.requested:
                self.bad(
                    seq,
                    5,
                    f"tool/result {call_id} answers no tool call the reply of step "
                    f"{step.turn}.{step.step} asked for",
                )
        step.answered.add(call_id)
        order = step.requested.get(call_id)
        if order is not None:
            if order < step.last_order:
                self.bad(
                    seq,
                    5,
                    f"tool/result {call_id} comes after the result of "
                    f"{step.last_answered}, but the model asked for {call_id} first; "
                    "results appear in model order",
                )
            else:
                step.last_order, step.last_answered = order, call_id

    def finish(self) -> list[InvariantViolation]:
        """Every violation, those of an open turn or step at the end included (unless live).
        Leaves the checker as it was: more records may be fed after (``LogSummary.check_with``)."""
        out = list(self.out)
        if not self.live:
            if self.step is not None:
                out.append(
                    InvariantViolation(
                        self.step.seq,
                        3,
                        f"step {self.step.turn}.{self.step.step} never ends "
                        "(a cold log has no open step; load() repairs a crashed one)",
                    )
                )
            if self.turn is not None:
                out.append(
                    InvariantViolation(
                        self.turn_seq,
                        2,
                        f"turn {self.turn} never ends (a cold log has no open "
                        "turn; load() repairs a crashed one)",
                    )
                )
        return out

    # --- the index of a long log keeps the checker's state (``_index``) -------------------------

    def to_json(self) -> dict[str, Any]:
        step = self.step
        return {
            "live": self.live,
            "out": [[v.seq, v.rule, v.message] for v in self.out],
            "expected_seq": self.expected_seq,
            "seen_first": self.seen_first,
            "last_turn": self.last_turn,
            "turn": self.turn,
            "turn_seq": self.turn_seq,
            "last_step": self.last_step,
            "step": None
            if step is None
            else {
                "turn": step.turn,
                "step": step.step,
                "seq": step.seq,
                "replied": step.replied,
                "requested": step.requested,
                "calls": step.calls,
                "answered": sorted(step.answered),
                "last_order": step.last_order,
                "last_answered": step.last_answered,
            },
            "call_ids": sorted(self.call_ids),
            "last_seq": self.last_seq,
            "step_starts": sorted(self.step_starts),
            "unclosed": sorted(self.unclosed),
            "last_compaction": self.last_compaction,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> _Checker:
        """The checker :meth:`to_json` gave; ``TypeError``/``KeyError``/``ValueError`` if it is
        not one."""
        checker = cls(_bool(obj["live"]))
        checker.out = [
            InvariantViolation(_int(seq), _int(rule), _str(message))
            for seq, rule, message in obj["out"]
        ]
        checker.expected_seq = _int(obj["expected_seq"])
        checker.seen_first = _bool(obj["seen_first"])
        checker.last_turn = _int(obj["last_turn"])
        checker.turn = None if obj["turn"] is None else _int(obj["turn"])
        checker.turn_seq = _int(obj["turn_seq"])
        checker.last_step = _int(obj["last_step"])
        step = obj["step"]
        if step is not None:
            last_answered = step["last_answered"]
            checker.step = _Step(
                _int(step["turn"]),
                _int(step["step"]),
                _int(step["seq"]),
                _bool(step["replied"]),
                {_str(k): _int(v) for k, v in step["requested"].items()},
                {_str(k): _int(v) for k, v in step["calls"].items()},
                {_str(c) for c in step["answered"]},
                _int(step["last_order"]),
                None if last_answered is None else _str(last_answered),
            )
        checker.call_ids = {_str(c) for c in obj["call_ids"]}
        checker.last_seq = _int(obj["last_seq"])
        checker.step_starts = {_int(s) for s in obj["step_starts"]}
        checker.unclosed = {_str(c) for c in obj["unclosed"]}
        checker.last_compaction = _int(obj["last_compaction"])
        return checker


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not a boolean")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def check(
    events: Iterable[AgentEvent | Mapping[str, Any]], *, live: bool = False
) -> list[InvariantViolation]:
    """Every violation of the log invariants, in log order (an empty list: the log is sound).

    ``events`` are records as ``read()`` returns them or plain dicts parsed from ``events.jsonl``
    (or from the output of ``andon run --json``), or what ``Agent.events()`` yields: live events
    are skipped.
    With ``live=True`` the log may end with one open turn and step (a session that is running);
    by default an open turn or step at the end is a violation (a cold log must be balanced).
    """
    checker = _Checker(live)
    for record in as_records(without_live_only(events)):
        checker.feed(record)
    return checker.finish()
