"""A resumed agent reads only what its history needs (``SessionLog.open(keep="history")``):
``session/start``, the first user message, and the log from the last compaction's cut on. What
it reads must rebuild the same history, and the same state, as reading every record: with and
without an index, with the cut before the index's end or after it, in a crashed log, and when
the cut cannot be placed."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from andon.session import (
    INDEX_NAME,
    ContextCompacted,
    ContextTrimmed,
    EventData,
    Record,
    SessionLog,
    SessionStart,
    StepStart,
    ToolResult,
    UserMessageEntered,
    check,
    encode_line,
    fold_state,
    history,
    read,
    summarize,
)
from andon.session._history_start import MAX_STEPS, HistoryStart
from tests.session.helpers import MODEL, long_turn

T0 = 1_764_661_200.0


def _turns(
    first: int, count: int, every: int | None, seq: int, last_step: int | None
) -> tuple[list[EventData], int | None]:
    """``count`` turns from turn ``first``, the first record at ``seq``; every ``every``-th
    compacts (keeping from the previous turn's second step) and the one halfway between trims
    the previous turn's result. Returns the records and the seq of the last turn's second
    step's start."""
    out: list[EventData] = []
    for n in range(first, first + count):
        turn = long_turn(n)
        if every and n % every == 0 and last_step is not None:
            summary = f"summary of turns 1 to {n - 1}"
            turn.insert(
                5, ContextCompacted(last_step, summary, 3, 9000, 3000, 8192, MODEL.name, None, n, 1)
            )
        elif every and n % every == every // 2 and n > 1:
            at = next(i for i, d in enumerate(turn) if isinstance(d, StepStart) and d.step == 2)
            turn.insert(at + 1, ContextTrimmed((f"c{n - 1}-1-1",), 5000, 4000, 8192, n, 2))
        at = next(i for i, d in enumerate(turn) if isinstance(d, StepStart) and d.step == 2)
        last_step = seq + len(out) + at
        out.extend(turn)
    return out, last_step


def _write(folder: Path, turns: int, every: int | None, *, crashed: bool = False) -> int | None:
    start = SessionStart(2, "s-0000000cut", "0.1.0", T0, "/tmp", MODEL, "prompt", 1, "test-host")
    events, last_step = _turns(1, turns, every, 1, None)
    events = [start, *events]
    if crashed:
        events.extend(long_turn(turns + 1)[:10])  # tool/call and tool/started, no result
    folder.mkdir(parents=True)
    with open(folder / "events.jsonl", "wb") as f:
        for seq, data in enumerate(events):
            f.write(encode_line(Record(seq, T0 + seq * 0.01, data)))
    return last_step


def _append(folder: Path, first: int, turns: int, every: int | None, last_step: int | None) -> None:
    records = read(folder)
    seq = records[-1].seq + 1
    events, _ = _turns(first, turns, every, seq, last_step)
    with open(folder / "events.jsonl", "ab") as f:
        for i, data in enumerate(events):
            f.write(encode_line(Record(seq + i, T0 + (seq + i) * 0.01, data)))


def _both(folder: Path, tmp: Path) -> tuple[SessionLog, SessionLog]:
    """The session opened twice, on two copies: every record, and the history part."""
    whole, part = tmp / "whole", tmp / "part"
    shutil.copytree(folder, whole)
    shutil.copytree(folder, part)
    a = SessionLog.open(whole, durability="none")
    b = SessionLog.open(part, durability="none", keep="history")
    return a, b


def _same(a: SessionLog, b: SessionLog) -> None:
    every = a.loaded.events
    part = b.loaded.events
    assert history(part) == history(every)
    assert b.loaded.state == fold_state(every) == a.loaded.state
    assert [r.seq for r in part] == sorted({r.seq for r in part})  # in order, none twice
    assert not check(every)
    if b.loaded.cut is not None:
        assert len(part) < len(every)
        assert part[0].seq == 0 and part[-1].seq == every[-1].seq


@pytest.mark.parametrize("every", [None, 3, 10])
def test_the_history_part_rebuilds_the_same_history_without_an_index(
    tmp_path: Path, every: int | None
) -> None:
    _write(tmp_path / "s", 60, every)
    a, b = _both(tmp_path / "s", tmp_path)
    with a, b:
        _same(a, b)
        assert (b.loaded.cut is None) == (every is None)
        assert a.loaded.cut is None


@pytest.mark.parametrize("crashed", [False, True])
def test_the_cut_before_the_index_end_is_read_from_the_log(tmp_path: Path, crashed: bool) -> None:
    # The index covers the last compaction; turns without one follow it.
    folder = tmp_path / "s"
    last_step = _write(folder, 400, 50)
    assert summarize(folder).indexed is False and (folder / INDEX_NAME).exists()
    _append(folder, 401, 20, None, last_step)
    if crashed:
        with open(folder / "events.jsonl", "ab") as f:
            seq = read(folder)[-1].seq + 1
            for i, data in enumerate(long_turn(421)[:10]):
                f.write(encode_line(Record(seq + i, T0 + seq + i, data)))
    a, b = _both(folder, tmp_path)
    with a, b:
        _same(a, b)
        assert b.loaded.cut is not None
        assert b.loaded.repaired == crashed


def test_a_cut_in_the_log_after_the_index_moves_the_start(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    last_step = _write(folder, 400, 50)
    summarize(folder)  # the index ends before the compactions appended next
    _append(folder, 401, 120, 50, last_step)
    a, b = _both(folder, tmp_path)
    with a, b:
        _same(a, b)
        cut = b.loaded.cut
        assert cut is not None
        kept = [r for r in b.loaded.events if r.seq >= cut]
        assert isinstance(kept[0].data, StepStart)
        assert len(b.loaded.events) - len(kept) == 2  # session/start and the first user message


def test_a_cut_the_fold_cannot_place_reads_everything(tmp_path: Path) -> None:
    # More step starts than the fold follows between two compactions: the kept_from of the
    # second is no longer known, and the whole log is the history part (right, only slower).
    fold = HistoryStart()
    records = [Record(0, T0, StepStart(1, 1))]
    records += [Record(i, T0, StepStart(1, i + 1)) for i in range(1, MAX_STEPS + 2)]
    for i, record in enumerate(records):
        fold.feed(record, i * 100, i)
    compaction = ContextCompacted(0, "s", 1, 10, 5, 100, MODEL.name, None, 1, MAX_STEPS + 2)
    fold.feed(Record(MAX_STEPS + 3, T0, compaction), 0, 0)
    assert fold.cut is None
    assert fold.keeps(records[0])
    placed = ContextCompacted(MAX_STEPS, "s", 1, 10, 5, 100, MODEL.name, None, 1, MAX_STEPS + 2)
    fold = HistoryStart()
    for i, record in enumerate(records):
        fold.feed(record, i * 100, i)
    fold.feed(Record(MAX_STEPS + 3, T0, placed), 0, 0)
    assert fold.cut is not None and fold.cut.seq == MAX_STEPS and fold.cut.offset == MAX_STEPS * 100
    assert not fold.keeps(records[5]) and fold.keeps(records[-1])
    assert HistoryStart.from_json(fold.to_json()).cut == fold.cut


# -- the rule checker's state stays small in a session that compacts -------------------------


def _records(events: list[EventData]) -> list[Record]:
    return [Record(seq, T0 + seq * 0.01, data) for seq, data in enumerate(events)]


def _session(turns: int, every: int | None) -> list[EventData]:
    start = SessionStart(2, "s-0000000cut", "0.1.0", T0, "/tmp", MODEL, "prompt", 1, "test-host")
    events, _ = _turns(1, turns, every, 1, None)
    return [start, *events]


def test_the_checker_holds_no_step_start_before_the_last_compaction_and_no_closed_call() -> None:
    from andon.session._check import _Checker

    checker = _Checker(live=False)
    for record in _records(_session(200, 10)):
        checker.feed(record)
    assert checker.finish() == []
    assert len(checker.step_starts) <= 2 * 10  # the steps since the last compaction
    assert checker.unclosed == set()  # every call was answered in a step that ended
    assert len(checker.call_ids) == 200


def _rule8(events: list[EventData]) -> list[str]:
    return [v.message for v in check(_records(events)) if v.rule == 8]


def test_a_trim_may_name_only_a_call_an_ended_step_answered() -> None:
    events = _session(3, None)
    step2 = next(
        i for i, d in enumerate(events) if isinstance(d, StepStart) and (d.turn, d.step) == (3, 2)
    )
    ok = ContextTrimmed(("c2-1-1",), 10, 5, 100, 3, 2)
    assert _rule8([*events[: step2 + 1], ok, *events[step2 + 1 :]]) == []
    unknown = ContextTrimmed(("c9-1-1",), 10, 5, 100, 3, 2)
    found = _rule8([*events[: step2 + 1], unknown, *events[step2 + 1 :]])
    assert found == ["context/trimmed names c9-1-1, which no earlier step answered"]
    # Its own step's call is answered, but in a step that has not ended yet.
    tool_result = next(
        i for i, d in enumerate(events) if isinstance(d, ToolResult) and d.call_id == "c3-1-1"
    )
    early = ContextTrimmed(("c3-1-1",), 10, 5, 100, 3, 1)
    # (Before the step's reply, as a trim must be: right after its user message.)
    at = next(i for i, d in enumerate(events) if isinstance(d, UserMessageEntered) and d.turn == 3)
    assert tool_result > at
    found = _rule8([*events[: at + 1], early, *events[at + 1 :]])
    assert found == ["context/trimmed names c3-1-1, which no earlier step answered"]


def test_a_compaction_must_keep_from_a_step_start_after_the_previous_one() -> None:
    events = _session(30, 10)
    cuts = [i for i, d in enumerate(events) if isinstance(d, ContextCompacted)]
    assert len(cuts) == 3 and _rule8(events) == []
    first_cut, second = events[cuts[0]], events[cuts[1]]
    assert isinstance(first_cut, ContextCompacted) and isinstance(second, ContextCompacted)
    # The second compaction keeps from the first one's cut: it would undo it.
    undo = dataclasses.replace(second, kept_from=first_cut.kept_from)
    found = _rule8([*events[: cuts[1]], undo, *events[cuts[1] + 1 :]])
    assert found == [
        f"context/compacted keeps from seq {first_cut.kept_from}, before the previous "
        f"compaction (seq {cuts[0]}) which it would undo"
    ]
    # Keeping from a record after the previous compaction that is no step/start.
    not_a_step = cuts[0] + 1
    assert not isinstance(events[not_a_step], StepStart)
    wrong = dataclasses.replace(second, kept_from=not_a_step)
    found = _rule8([*events[: cuts[1]], wrong, *events[cuts[1] + 1 :]])
    assert found == [
        f"context/compacted keeps from seq {not_a_step}, which is no earlier step/start"
    ]
