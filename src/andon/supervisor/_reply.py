"""A streaming reply on its way in: assembled for the step (:class:`Reply`) and logged
(:class:`ChunkLog`: every delta shown live at once, the log coalesced into ``assistant/chunk``
records of at most 16 ms or 4 KiB: docs/log-format.md, Streamed deltas)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from andon.base import Clock, Timer
from andon.llm import Finish, FinishReason, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from andon.session import AssistantChunk, AssistantDelta, ReasoningBlock, TextBlock
from andon.supervisor._host import TurnHost

__all__ = ["CHUNK_FLUSH_AFTER", "CHUNK_FLUSH_BYTES", "ChunkLog", "Reply"]

CHUNK_FLUSH_AFTER = 0.016
"""Seconds after its first delta that a buffered ``assistant/chunk`` record is written
(docs/log-format.md, Streamed deltas: at most one record per 16 ms or 4 KiB of deltas)."""
CHUNK_FLUSH_BYTES = 4096
"""Bytes of buffered delta text (UTF-8) at which the record is written at once."""


@dataclass
class _Segment:
    """One run of text or reasoning; its pieces are joined once, when the reply is used (adding
    to one growing string would copy the whole run at every delta: quadratic in the reply)."""

    kind: str
    pieces: list[str]

    @property
    def text(self) -> str:
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""


@dataclass
class Reply:
    """A streaming reply being assembled, in the order the model produced it."""

    segments: list[_Segment] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # arguments: list of pieces
    usage: dict[str, Any] | None = None
    finish: FinishReason | None = None

    def add(self, chunk: object) -> dict[str, Any] | None:
        """Fold one chunk in; return the delta as ``assistant/chunk`` logs it, if it is one."""
        match chunk:
            case TextDelta() | ReasoningDelta():
                kind = chunk.type
                if self.segments and self.segments[-1].kind == kind:
                    self.segments[-1].pieces.append(chunk.text)
                else:
                    self.segments.append(_Segment(kind, [chunk.text]))
                return chunk.to_dict()
            case ToolCallDelta():
                call = self.calls.setdefault(
                    chunk.index, {"provider_id": None, "name": None, "arguments": []}
                )
                if chunk.provider_id:
                    call["provider_id"] = chunk.provider_id
                if chunk.name:
                    call["name"] = chunk.name
                call["arguments"].append(chunk.arguments)
                return chunk.to_dict()
            case Usage():
                # Every count the provider reported (the optional ones only when reported).
                self.usage = dict(chunk.to_dict())
            case Finish():
                self.finish = chunk.reason
        return None

    def arguments(self, index: int) -> str:
        return "".join(self.calls[index]["arguments"])

    def visible_blocks(self) -> list[TextBlock | ReasoningBlock]:
        """Text and reasoning blocks with non-whitespace content, in order."""
        blocks: list[TextBlock | ReasoningBlock] = []
        for segment in self.segments:
            text = segment.text
            if text.strip():
                blocks.append(TextBlock(text) if segment.kind == "text" else ReasoningBlock(text))
        return blocks


class ChunkLog:
    """The deltas of one reply on their way to subscribers and to the log.

    Each delta is published live (``assistant/delta``, no ``seq``) the moment it is handled, and
    buffered for the log: one ``assistant/chunk`` record per flush, adjacent deltas of one kind
    merged inside it (text with text, reasoning with reasoning, argument fragments of one tool
    call), so folding the record's deltas gives exactly what folding the originals gives.

    A flush happens at ``CHUNK_FLUSH_BYTES`` of buffered text, and ``CHUNK_FLUSH_AFTER`` after
    the first buffered delta: checked at each delta (a fast stream may never yield to the loop,
    so a timer alone could fire late) and by a clock timer (a model that stalls after one delta
    is in the log ~16 ms later, not when the stall ends). The step flushes explicitly
    before everything that must follow the deltas: the end of the stream, ``assistant/message``
    (also a salvaged prefix, whose text must be in the chunks), a retry's records, and on every
    path that ends the stream by raising.

    The timer writes from a loop callback, where an exception has no one to go to: it is kept
    and raised by the step's next call here.
    """

    __slots__ = (
        "attempt",
        "clock",
        "deadline",
        "entries",
        "failure",
        "publish",
        "size",
        "step",
        "timer",
        "turn",
        "write",
    )

    def __init__(self, host: TurnHost, turn: int, step: int) -> None:
        self.write = host.log.write
        self.publish = host.log.publish
        self.clock: Clock = host.clock
        self.turn = turn
        self.step = step
        self.attempt = 0
        # (head: the delta without its text, the key of its text, the text pieces)
        self.entries: list[tuple[dict[str, Any], str, list[str]]] = []
        self.size = 0
        self.deadline = 0.0
        self.timer: Timer | None = None
        self.failure: Exception | None = None

    def add(self, delta: dict[str, Any]) -> None:
        """One delta, as it arrives: shown live now, logged at the next flush."""
        self.raise_failure()
        self.publish(AssistantDelta(self.turn, self.step, self.attempt, delta))
        key = "arguments" if delta["type"] == "tool_call" else "text"
        text: str = delta[key]
        if not self._merge(delta, key, text):
            head = {k: v for k, v in delta.items() if k != key}
            self.entries.append((head, key, [text]))
        self.size += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        now = self.clock.monotonic()
        if self.timer is None:  # the first delta of this record
            self.deadline = now + CHUNK_FLUSH_AFTER
            self.timer = self.clock.call_at(self.deadline, self._on_timer)
        elif now >= self.deadline:
            self.flush()
            return
        if self.size >= CHUNK_FLUSH_BYTES:
            self.flush()

    def _merge(self, delta: dict[str, Any], key: str, text: str) -> bool:
        if not self.entries:
            return False
        head, last_key, pieces = self.entries[-1]
        if head["type"] != delta["type"] or last_key != key:
            return False
        if key == "arguments" and (
            head.get("index") != delta.get("index") or "provider_id" in delta or "name" in delta
        ):
            return False  # another call, or a fragment that names the call: its own delta
        pieces.append(text)
        return True

    def flush(self) -> None:
        """Write what is buffered as one ``assistant/chunk`` record (nothing if empty)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.entries:
            return
        deltas = tuple({**head, key: "".join(pieces)} for head, key, pieces in self.entries)
        self.entries = []
        self.size = 0
        self.write(AssistantChunk(self.turn, self.step, self.attempt, deltas))

    def close(self) -> None:
        """The stream has ended: everything shown is now logged (or the failure raised)."""
        self.raise_failure()
        self.flush()

    def abandon(self) -> None:
        """Flush on a path that is already raising: the failure in flight is the one that ends
        the step. A log that cannot be written has been remembered by the agent (LogPort), and
        the next write of the step raises it again."""
        with contextlib.suppress(Exception):
            self.flush()

    def raise_failure(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _on_timer(self) -> None:
        self.timer = None
        try:
            self.flush()
        except Exception as e:  # a loop callback: keep it for the step to raise
            if self.failure is None:
                self.failure = e
