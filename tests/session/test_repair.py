"""Cold load and crash repair, on the golden fixtures and on crafted crashes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from andon.base import LogCorrupted, ManualClock, SessionLive
from andon.session import (
    REPAIR_TEXTS,
    Record,
    SessionRepaired,
    check,
    fold_state,
    history,
    load,
    read,
    repair,
)
from tests.session.helpers import (
    FIXTURES,
    WALL_START,
    Sim,
    copy_fixture,
    lines_of,
    snapshot,
    validate_request,
)

CHILD = Path(__file__).with_name("_child.py")
NOW = WALL_START + 3600.0

BALANCED = ["complete", "cancelled-mid-stream", "cancelled-mid-tool", "cancel-discarded-queue",
            "repaired-and-resumed", "compacted", "mcp-servers"]  # fmt: skip

UNKNOWN = {"code": "TOOL_OUTCOME_UNKNOWN", "name": "HarnessStopped"}
NOT_STARTED = {"code": "TOOL_NOT_STARTED", "name": "HarnessStopped"}
# fixture -> the closers repair must append: (type, the data fields that matter)
EXPECTED: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "crashed-before-tool-start": [
        ("tool/result", {"call_id": "c1-1-1", "error": NOT_STARTED}),
        ("tool/result", {"call_id": "c1-1-2", "error": NOT_STARTED}),
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ],
    "crashed-mid-tool": [
        ("tool/result", {"call_id": "c1-1-1", "error": UNKNOWN}),
        ("tool/result", {"call_id": "c1-1-2", "error": NOT_STARTED}),
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ],
    "crashed-mid-stream": [
        ("step/end", {"turn": 1, "step": 2}),
        ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ],
    "torn-tail": [
        ("tool/result", {"call_id": "c1-1-1", "error": UNKNOWN}),
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ],
}
ALL = sorted(p.name for p in FIXTURES.iterdir() if p.name != "corrupt-middle")


def _without_lock(folder: Path) -> dict[str, bytes]:
    # load() takes the session lock, which creates the (empty, released) lock file in a fixture
    # copy; that file is runtime state, not part of the log
    return {k: v for k, v in snapshot(folder).items() if k != "lock"}


def _matches(actual: dict[str, Any], expected: dict[str, Any]) -> bool:
    return all(
        _matches(actual.get(k, {}), v) if isinstance(v, dict) else actual.get(k) == v
        for k, v in expected.items()
    )


def test_every_fixture_is_covered() -> None:
    assert set(ALL) == set(BALANCED) | set(EXPECTED)


@pytest.mark.parametrize("name", ALL)
def test_fixture_loads_to_a_sound_log_and_a_valid_request(tmp_path: Path, name: str) -> None:
    folder = copy_fixture(name, tmp_path)
    original = read(folder)
    before = _without_lock(folder)
    loaded = load(folder, clock=ManualClock(start=0.0, wall_start=NOW))

    # every complete record is kept, unchanged and in place
    assert [r.to_dict() for r in loaded.events[: len(original)]] == [r.to_dict() for r in original]
    assert check(loaded.events) == []
    validate_request(history(loaded.events))
    state = fold_state(loaded.events)
    assert (state.open_turn, state.open_step) == (None, None)

    if name in BALANCED:
        assert not loaded.repaired and loaded.closers == ()
        assert _without_lock(folder) == before  # a balanced log: nothing written
    else:
        assert loaded.repaired
        got = [(r.type, r.to_dict()["data"]) for r in loaded.closers]
        assert [t for t, _ in got] == [t for t, _ in EXPECTED[name]]
        for (_, data), (_, want) in zip(got, EXPECTED[name], strict=True):
            assert _matches(data, want), (data, want)
        assert all(r.synthetic == "repair" and r.time == NOW for r in loaded.closers)
        summary = loaded.events[-1]
        assert summary.synthetic == "repair"
        assert isinstance(summary.data, SessionRepaired)
        assert summary.data.closers == len(EXPECTED[name])
        assert summary.data.killed_leftovers == 0  # the fixtures ran on another host
        # what is on disk is what load returned
        assert [r.to_dict() for r in read(folder)] == [r.to_dict() for r in loaded.events]

    # idempotent: a second load changes nothing
    after = _without_lock(folder)
    again = load(folder)
    assert not again.repaired
    assert _without_lock(folder) == after
    # the history is the same from records and from plain dicts
    lines = (folder / "events.jsonl").read_bytes().splitlines()
    assert history(json.loads(line) for line in lines) == history(loaded.events)


def test_repair_texts_say_what_the_model_needs() -> None:
    unknown = REPAIR_TEXTS.unknown_content
    assert "stopped while the call was running" in unknown
    assert "fully, partly or not at all" in unknown
    assert "read-only or idempotent" in unknown and "ask the user" in unknown
    assert unknown.endswith("Do not retry blindly.")
    started = REPAIR_TEXTS.not_started_content
    assert "never started" in started and "did not run" in started
    assert "may be retried if it is still needed" in started


def test_corrupt_middle_is_refused_and_left_byte_for_byte(tmp_path: Path) -> None:
    folder = copy_fixture("corrupt-middle", tmp_path)
    before = snapshot(folder)
    with pytest.raises(LogCorrupted) as info:
        load(folder)
    assert info.value.line == 10
    assert _without_lock(folder) == before
    assert (folder / "lock").read_bytes() == b""  # the lock was released
    with pytest.raises(LogCorrupted):
        repair(folder, dry_run=True)
    assert _without_lock(folder) == before


def test_torn_tail_is_moved_aside_not_destroyed(tmp_path: Path) -> None:
    folder = copy_fixture("torn-tail", tmp_path)
    raw = (folder / "events.jsonl").read_bytes()
    torn = read(folder).torn
    assert torn is not None
    loaded = load(folder)
    saved = folder / f"events.jsonl.torn-{torn.offset}"
    assert saved.read_bytes() == raw[torn.offset :]
    assert saved.stat().st_mode & 0o777 == 0o600
    summary = loaded.events[-1].data
    assert isinstance(summary, SessionRepaired)
    assert (summary.torn_bytes, summary.torn_file) == (torn.length, saved.name)
    assert (folder / "events.jsonl").read_bytes().startswith(raw[: torn.offset])


def test_a_repair_killed_after_saving_the_torn_bytes_is_completed(tmp_path: Path) -> None:
    folder = copy_fixture("torn-tail", tmp_path)
    raw = (folder / "events.jsonl").read_bytes()
    torn = read(folder).torn
    assert torn is not None
    # as if an earlier repair died right after saving the torn bytes, before cutting the log
    (folder / f"events.jsonl.torn-{torn.offset}").write_bytes(raw[torn.offset :])
    loaded = load(folder)
    assert sorted(p.name for p in folder.glob("events.jsonl.torn-*")) == [
        f"events.jsonl.torn-{torn.offset}"
    ]
    assert check(loaded.events) == []


def test_dry_run_says_what_would_be_appended_and_changes_nothing(tmp_path: Path) -> None:
    folder = copy_fixture("torn-tail", tmp_path)
    before = _without_lock(folder)
    clock = ManualClock(start=0.0, wall_start=NOW)
    plan = repair(folder, dry_run=True, clock=clock)
    assert plan.dry_run and plan.repaired and plan.torn is not None
    assert _without_lock(folder) == before
    done = repair(folder, clock=clock)
    assert [r.to_dict() for r in done.appended] == [r.to_dict() for r in plan.appended]
    assert repair(folder, dry_run=True).appended == ()


def test_a_crash_during_the_first_append_leaves_an_empty_log(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    sim = Sim()
    sim.start()
    line = lines_of(sim.data())[0]
    (folder / "events.jsonl").write_bytes(line[:30])
    loaded = load(folder)
    assert loaded.events == [] and loaded.repaired and loaded.closers == ()
    assert (folder / "events.jsonl").read_bytes() == b""
    assert (folder / "events.jsonl.torn-0").read_bytes() == line[:30]


def test_an_open_turn_without_a_step_gets_only_its_turn_end(tmp_path: Path) -> None:
    sim = Sim()
    sim.start()
    sim.queue("hi")
    sim.begin_turn()
    sim.claim(first_step=True)  # the crash came between the claim and step/start
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "events.jsonl").write_bytes(b"".join(lines_of(sim.data())))
    loaded = load(folder)
    assert [r.type for r in loaded.closers] == ["turn/end"]
    assert check(loaded.events) == []


def test_a_session_locked_by_another_live_process_is_refused(tmp_path: Path) -> None:
    folder = copy_fixture("crashed-mid-tool", tmp_path)
    holder = subprocess.Popen(
        [sys.executable, str(CHILD), "hold-lock", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        # the child repaired the crashed log when it opened it; wait until it holds the lock
        assert holder.stdout.readline() == b"locked\n"
        before = snapshot(folder)
        with pytest.raises(SessionLive) as info:
            load(folder)
        assert info.value.pid == holder.pid
        assert str(holder.pid) in str(info.value)
        with pytest.raises(SessionLive):
            repair(folder, dry_run=True)
        assert snapshot(folder) == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
        holder.stdout.close()
    assert not load(folder).repaired  # released on exit; the log balances


def test_records_returned_by_load_are_records() -> None:
    # a small guard for users: the public type of load().events
    assert Record.__name__ == "Record"
