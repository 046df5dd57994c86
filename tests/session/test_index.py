"""The index of a long log (docs/log-format.md, The index of a long log): used only when it
verifies against the log's bytes; a damaged, cut, stale, foreign, wrong-version or unreadable
index is ignored, the full read is done and the index is written again.

Every test that damages something also checks what a reader that trusted the index would have
got wrong: the damage is chosen so that the result differs from the truth.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest

from andon.base import LogCorrupted, ManualClock
from andon.session import (
    InboxSpliced,
    Record,
    SessionLog,
    SessionStart,
    TurnStart,
    UserMessage,
    check,
    encode_line,
    fold_consumed_work,
    fold_state,
    load,
    read,
    repair,
)
from andon.session._index import INDEX_NAME, INDEX_VERSION, LogSummary, summarize
from tests.session.helpers import MODEL, T0, long_log, long_turn, snapshot


def truth(folder: Path) -> tuple[object, ...]:
    """What a full read of the log says, by the public folds over a list."""
    records = read(folder)
    return (
        len(records),
        records.torn,
        tuple(check(records)),
        fold_state(records),
        fold_consumed_work(records),
        records[0] if records else None,
    )


def said(summary: LogSummary) -> tuple[object, ...]:
    return (
        summary.records,
        summary.torn,
        summary.violations,
        summary.state,
        summary.consumed,
        summary.first,
    )


def flip(path: Path, offset: int, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    assert data[offset : offset + len(new)] != new
    data[offset : offset + len(new)] = new
    path.write_bytes(bytes(data))


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    """A crashed long log with a valid index beside it."""
    folder = long_log(tmp_path / "s")
    first = summarize(folder)
    assert not first.indexed and (folder / INDEX_NAME).is_file()
    assert summarize(folder).indexed
    return folder


def test_index_gives_what_a_full_read_gives(indexed: Path) -> None:
    """The state restored from the index and the tail after it equal the full read's."""
    with open(indexed / "events.jsonl", "ab") as f:  # more after the index: the tail is read
        seq = len(read(indexed))
        f.write(encode_line(Record(seq, T0 + 9e4, InboxSpliced("next-step", 0, (
            UserMessage("m-0000000cafe0", "steer"),)))))  # fmt: skip
    summary = summarize(indexed)
    assert summary.indexed
    assert said(summary) == truth(indexed)
    assert summary.state.next_turn and summary.state.next_step and summary.state.open_turn
    assert summary.violations  # the crashed turn is open: a cold log may not end so


def test_short_log_gets_no_index(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    lines = [encode_line(Record(0, T0, SessionStart(2, "s-0000000short", "0.1.0", T0, "/tmp",
                                                    MODEL, "p", 1, "h")))]  # fmt: skip
    lines += [encode_line(Record(i + 1, T0, d)) for i, d in enumerate(long_turn(1))]
    (folder / "events.jsonl").write_bytes(b"".join(lines))
    assert not summarize(folder).indexed
    load(folder)
    repair(folder)
    assert not (folder / INDEX_NAME).exists()


def _ignored(folder: Path, caplog: pytest.LogCaptureFixture, why: str) -> None:
    """The index is ignored (a debug line saying why), the result is the full read's, and a
    valid index is there again afterwards."""
    with caplog.at_level(logging.DEBUG, logger="andon.session"):
        summary = summarize(folder)
    assert not summary.indexed
    assert said(summary) == truth(folder)
    assert any("index is ignored" in r.message and why in r.message for r in caplog.records), [
        r.message for r in caplog.records
    ]
    assert all(r.levelno == logging.DEBUG for r in caplog.records)
    assert summarize(folder).indexed  # rewritten


def test_a_byte_changed_in_the_covered_log_is_caught(
    indexed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log's hash covers every byte: a seq changed in the middle (a valid line still, and
    invariant 1 now broken) makes the index useless, and check sees the change."""
    log = indexed / "events.jsonl"
    offset = log.read_bytes().index(b'{"seq":500,')
    flip(log, offset + len('{"seq":'), b"600")
    _ignored(indexed, caplog, "do not match its hash")
    assert any(v.rule == 1 for v in summarize(indexed).violations)


def test_a_byte_changed_in_the_index_is_caught(
    indexed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The index's own hash: a changed record count (still valid JSON) is refused."""
    index = indexed / INDEX_NAME
    data = index.read_bytes()
    at = data.index(b'"records":') + len(b'"records":')
    flip(index, at, b"9" if data[at : at + 1] != b"9" else b"8")
    _ignored(indexed, caplog, "its own hash")


def test_a_cut_index_is_ignored(indexed: Path, caplog: pytest.LogCaptureFixture) -> None:
    index = indexed / INDEX_NAME
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    _ignored(indexed, caplog, "its own hash")


def test_an_index_of_a_longer_log_is_stale(indexed: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The log was cut back (by hand, to a whole line) below what the index covers."""
    log = indexed / "events.jsonl"
    data = log.read_bytes()
    log.write_bytes(data[: data.index(b"\n", len(data) // 2) + 1])
    _ignored(indexed, caplog, "stale")


def test_another_sessions_index_is_ignored(
    indexed: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Same shape, same size, another session: its state (session id) would be wrong here."""
    other = long_log(tmp_path / "other", session_id="s-000000other")
    summarize(other)
    shutil.copy(indexed / INDEX_NAME, other / INDEX_NAME)
    _ignored(other, caplog, "another log")
    assert summarize(other).state.session_id == "s-000000other"


def _rewrite_index(index: Path, version: int, change: dict[str, int]) -> None:
    """An index whose own hash is right, of ``version``, with ``change`` made to its scan."""
    _, text = index.read_bytes().split(b"\n", 1)
    body = json.loads(text)
    body["scan"].update(change)
    new = json.dumps(body, separators=(",", ":")).encode() + b"\n"
    head = {"andon_index": version, "sha256": hashlib.sha256(new).hexdigest()}
    index.write_bytes(json.dumps(head).encode() + b"\n" + new)


def test_an_index_of_another_version_is_ignored(
    indexed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A version this andon does not write may hold the same keys meaning something else."""
    records = summarize(indexed).records
    other = INDEX_VERSION + 1
    _rewrite_index(indexed / INDEX_NAME, other, {"records": records + 5})
    _ignored(indexed, caplog, f"version {other}")


def test_the_same_index_of_this_version_is_used(indexed: Path) -> None:
    """The counterpart of the test above: the rewrite itself keeps a valid index valid."""
    records = summarize(indexed).records
    _rewrite_index(indexed / INDEX_NAME, INDEX_VERSION, {"records": records})
    assert summarize(indexed).indexed


@pytest.mark.parametrize("junk", [b"", b"not json\n", b'{"andon_index":1}\n[]\n', b"\xff\xfe\n"])
def test_an_unreadable_index_is_ignored(
    indexed: Path, caplog: pytest.LogCaptureFixture, junk: bytes
) -> None:
    (indexed / INDEX_NAME).write_bytes(junk)
    _ignored(indexed, caplog, "")


def test_an_index_that_cannot_be_written_is_no_error(indexed: Path) -> None:
    """A folder in the index's place: it can be neither read nor replaced; reads go on."""
    (indexed / INDEX_NAME).unlink()
    (indexed / INDEX_NAME).mkdir()
    summary = summarize(indexed)
    assert not summary.indexed and said(summary) == truth(indexed)
    assert (indexed / INDEX_NAME).is_dir()
    # no temporary file left behind
    assert sorted(p.name for p in indexed.iterdir()) == sorted([INDEX_NAME, "events.jsonl"])


def test_repair_decides_the_same_with_and_without_the_index(tmp_path: Path) -> None:
    """A crashed long log (an open turn, a running call, a torn last line): repair from the index
    appends exactly the bytes a full read's repair appends."""
    plain = long_log(tmp_path / "plain")
    with open(plain / "events.jsonl", "ab") as f:
        f.write(b'{"seq":99999,"time":1.0,"type":"tool/res')  # torn
    fast = tmp_path / "fast"
    shutil.copytree(plain, fast)
    assert not summarize(fast).indexed and summarize(fast).indexed  # fast has an index
    (plain / INDEX_NAME).unlink(missing_ok=True)
    reports = []
    for folder in (plain, fast):
        clock = ManualClock(start=0.0, wall_start=T0 + 1e5)
        reports.append(repair(folder, clock=clock))
    assert reports[0].repaired and reports[0].closers
    assert reports[0] == reports[1]
    assert (plain / "events.jsonl").read_bytes() == (fast / "events.jsonl").read_bytes()
    assert not summarize(fast).violations


def test_load_leaves_an_index_that_repair_then_uses(tmp_path: Path) -> None:
    """``load`` (which returns every record) reads in full and leaves an index covering what it
    appended too; the next check reads only what came after."""
    folder = long_log(tmp_path / "s")
    loaded = load(folder)
    assert loaded.repaired
    summary = summarize(folder)
    assert summary.indexed and not summary.violations
    assert said(summary) == truth(folder)


async def test_a_resumed_log_replays_its_new_records_without_parsing_the_old(
    tmp_path: Path,
) -> None:
    """``SessionLog.records_from(seq)`` for a seq at or past what the open read starts where that
    read ended: the agent's replay of a resumed run's records (``andon resume --json``) does not
    parse the million before them. A byte broken in the old part after the open shows it: a
    full read would refuse the log, this one never reaches that line."""
    folder = long_log(tmp_path / "s")
    since = len(read(folder))  # the resume's first record: repair's closers come first
    log = SessionLog.open(folder, durability="none")
    try:
        log.append(TurnStart(log.last_turn + 1))
        expected = [r for r in read(folder) if r.seq >= since]
        assert [r.type for r in expected][-2:] == ["session/repaired", "turn/start"]
        data = (folder / "events.jsonl").read_bytes()
        at = data.index(b'{"seq":300,')
        with open(folder / "events.jsonl", "r+b") as f:
            f.seek(at)
            f.write(b"[")  # that line is no longer a record
        assert list(log.records_from(since)) == expected
        assert list(log.records_from(since + 1)) == expected[1:]
        with pytest.raises(LogCorrupted):
            list(log.records_from(5))  # before the read's end: from the first line
    finally:
        await log.aclose()


def test_a_dry_run_changes_nothing_not_even_the_index(tmp_path: Path) -> None:
    """``repair(dry_run=True)`` reads a long log in full and leaves no index: it changes nothing."""
    folder = long_log(tmp_path / "s")
    before = snapshot(folder)
    assert repair(folder, dry_run=True).closers
    after = snapshot(folder)
    assert after.pop("lock") == b""  # the session lock it took (a file every load leaves)
    assert after == before


def test_load_with_the_index_returns_every_record_as_without(tmp_path: Path) -> None:
    """``load`` returns every record either way; with a valid index it only does not fold again
    what the index holds, and repairs the same."""
    plain = long_log(tmp_path / "plain")
    fast = tmp_path / "fast"
    shutil.copytree(plain, fast)
    assert not summarize(fast).indexed and summarize(fast).indexed
    loads = [load(f, clock=ManualClock(start=0.0, wall_start=T0 + 1e5)) for f in (plain, fast)]
    assert loads[0].events == loads[1].events and loads[0].report == loads[1].report
    assert [r.seq for r in loads[1].events] == list(range(len(loads[1].events)))
    assert (plain / "events.jsonl").read_bytes() == (fast / "events.jsonl").read_bytes()
