"""Where a log's model-visible history starts: what a resumed agent has to read.

After ``context/compacted`` the history is the session's first user message, the summary, and
the messages from the record ``kept_from`` on (``history_entries``); nothing before that cut can
reach the model again. So a resumed agent needs only ``session/start``, the first
``user/message``, and the records from the last cut on, and a long session that compacts
resumes in time and memory set by its compaction period, not its length (docs/log-format.md,
The index of a long log).

The fold follows the byte offset and line of each ``step/start`` since the last cut (a cut is
always one of them), so the reader can seek straight to it. It follows at most
:data:`MAX_STEPS`: a cut it cannot place (a log that did not compact for longer, or named a
record that is not a step start) is "from the beginning", which is always right, only slower.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Final

from andon.session._context_events import ContextCompacted
from andon.session._records import Record, SessionStart, StepStart, UserMessageEntered

__all__ = ["MAX_STEPS", "Cut", "HistoryStart"]

MAX_STEPS: Final = 4096
"""Step starts followed since the last cut (an index holds them: about 100 KB at most)."""


@dataclass(frozen=True, slots=True)
class Cut:
    """A record the history starts from: its ``seq``, the byte offset its line starts at, and
    how many lines come before it."""

    seq: int
    offset: int
    line: int


class HistoryStart:
    """The fold: ``first_user`` (the first ``user/message`` record) and ``cut`` (where the last
    compaction's kept part starts; None: from the beginning)."""

    __slots__ = ("cut", "first_user", "steps")

    def __init__(self) -> None:
        self.first_user: Record | None = None
        self.cut: Cut | None = None
        self.steps: collections.deque[Cut] = collections.deque(maxlen=MAX_STEPS)

    def feed(self, record: Record, offset: int, line: int) -> None:
        """One record, whose line starts at byte ``offset`` after ``line`` lines."""
        match record.data:
            case UserMessageEntered() if self.first_user is None:
                self.first_user = record
            case StepStart():
                self.steps.append(Cut(record.seq, offset, line))
            case ContextCompacted(kept_from=kept_from):
                while self.steps and self.steps[0].seq < kept_from:
                    self.steps.popleft()
                found = self.steps[0] if self.steps and self.steps[0].seq == kept_from else None
                # Not found: the whole log is read (the history is still right, only slower).
                self.cut = found
                if found is None:
                    self.steps.clear()
            case _:
                pass

    def keeps(self, record: Record) -> bool:
        """Whether a resumed agent needs ``record``, as of the records fed so far."""
        cut = self.cut
        if cut is None or record.seq >= cut.seq:
            return True
        first = self.first_user
        return isinstance(record.data, SessionStart) or (
            first is not None and record.seq == first.seq
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "first_user": None if self.first_user is None else self.first_user.to_dict(),
            "cut": None if self.cut is None else _cut_json(self.cut),
            "steps": [_cut_json(c) for c in self.steps],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> HistoryStart:
        fold = cls()
        first, cut = obj["first_user"], obj["cut"]
        fold.first_user = None if first is None else Record.from_dict(first)
        fold.cut = None if cut is None else _cut(cut)
        fold.steps.extend(_cut(c) for c in obj["steps"])
        return fold


def _cut_json(cut: Cut) -> list[int]:
    return [cut.seq, cut.offset, cut.line]


def _cut(value: Any) -> Cut:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise TypeError(f"a cut is three counts, not {value!r}")
    return Cut(*value)
