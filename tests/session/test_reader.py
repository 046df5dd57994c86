"""Reading: streaming, torn tails left out and reported, corruption and unknown formats refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from andon.base import LogCorrupted, LogFormatUnsupported, SessionError
from andon.session import Record, TurnStart, _reader, iter_records, read
from tests.session.helpers import FIXTURES, Sim, copy_fixture, lines_of, snapshot


def _session(tmp_path: Path, tail: bytes = b"", *, turns: int = 2) -> tuple[Path, list[bytes]]:
    sim = Sim()
    sim.start()
    for _ in range(turns):
        sim.queue("hi")
        sim.begin_turn()
    lines = lines_of(d for d in sim.data() if not isinstance(d, TurnStart))
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "events.jsonl").write_bytes(b"".join(lines) + tail)
    return folder, lines


def test_read_returns_records_and_no_torn_tail(tmp_path: Path) -> None:
    folder, lines = _session(tmp_path)
    records = read(folder)
    assert [r.seq for r in records] == list(range(len(lines)))
    assert records.torn is None
    # a path to the log file works as well as the folder
    assert [r.to_dict() for r in read(folder / "events.jsonl")] == [r.to_dict() for r in records]


@pytest.mark.parametrize(
    "tail",
    [
        b'{"seq":3,"time":1.0,"type":"turn/st',  # cut mid-line
        b'{"seq":3,"time":1.0,"type":"turn/start","data":{"turn":1}}',  # whole JSON, no newline
        b"\x00\x00\x00\x00\n",  # a terminated line that does not parse
        b'{"seq":3,"time":NaN,"type":"turn/start","data":{"turn":1}}\n',  # not our JSON
        b'{"seq":3,"text":"\xff\xfe"}\n',  # not UTF-8
        b"[1, 2]\n",  # JSON, but not an object
        b"\n",  # an empty line at the very end
    ],
)
def test_torn_tail_is_left_out_and_reported(tmp_path: Path, tail: bytes) -> None:
    folder, lines = _session(tmp_path, tail)
    before = snapshot(folder)
    records = read(folder)
    assert len(records) == len(lines)
    assert records.torn is not None
    offset = sum(map(len, lines))
    assert (records.torn.offset, records.torn.length) == (offset, len(tail))
    assert records.torn.line == len(lines) + 1
    assert records.torn.terminated == tail.endswith(b"\n")
    assert snapshot(folder) == before  # reading never repairs


@pytest.mark.parametrize("bad", [b"garbage\n", b"\x00\x00\n", b"\n", b'{"seq": 1\n'])
def test_bad_line_followed_by_good_lines_is_corruption(tmp_path: Path, bad: bytes) -> None:
    folder, lines = _session(tmp_path)
    lines.insert(2, bad)
    (folder / "events.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(LogCorrupted) as info:
        read(folder)
    assert info.value.line == 3
    assert info.value.offset == len(lines[0]) + len(lines[1])
    assert "line 3" in str(info.value) and f"byte offset {info.value.offset}" in str(info.value)


def test_bad_line_followed_by_a_torn_line_is_still_corruption(tmp_path: Path) -> None:
    # one append is in flight at a time: two bad lines cannot both be a torn write
    folder, lines = _session(tmp_path, b'garbage\n{"seq":9')
    with pytest.raises(LogCorrupted) as info:
        read(folder)
    assert info.value.line == len(lines) + 1


def test_a_whole_line_that_is_not_a_valid_record_is_corruption_even_at_the_end(
    tmp_path: Path,
) -> None:
    line = json.dumps({"seq": 3, "time": 1.0, "type": "turn/start", "data": {"turn": "one"}})
    folder, lines = _session(tmp_path, line.encode() + b"\n")
    with pytest.raises(LogCorrupted, match="turn must be an integer") as info:
        read(folder)
    assert info.value.line == len(lines) + 1


def test_unknown_type_fails_unless_ignorable(tmp_path: Path) -> None:
    future = {"seq": 3, "time": 1.0, "type": "agent/mood", "data": {"mood": "calm"}}
    folder, lines = _session(tmp_path, json.dumps(future).encode() + b"\n")
    with pytest.raises(LogFormatUnsupported) as info:
        read(folder)
    assert (info.value.seq, info.value.record_type) == (3, "agent/mood")
    future["ignorable"] = True
    (folder / "events.jsonl").write_bytes(b"".join(lines) + json.dumps(future).encode() + b"\n")
    records = read(folder)
    assert records[-1].type == "agent/mood" and records[-1].ignorable


def test_iter_records_streams_and_can_stop_early(tmp_path: Path) -> None:
    folder, lines = _session(tmp_path, b'{"seq":')
    stream = iter_records(folder)
    first = next(stream)
    assert isinstance(first, Record) and first.seq == 0
    assert stream.torn is None  # not known until the end
    stream.close()
    with iter_records(folder) as stream:
        assert sum(1 for _ in stream) == len(lines)
        assert stream.torn is not None and stream.end_offset == sum(map(len, lines))


def test_missing_log_is_a_session_error(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="holds no session log"):
        read(tmp_path)


def test_corrupt_middle_fixture_names_line_and_offset(tmp_path: Path) -> None:
    folder = copy_fixture("corrupt-middle", tmp_path)
    lines = (FIXTURES / "corrupt-middle" / "events.jsonl").read_bytes().splitlines(keepends=True)
    with pytest.raises(LogCorrupted) as info:
        read(folder)
    assert info.value.line == 10
    assert info.value.offset == sum(map(len, lines[:9]))


def test_an_append_in_progress_is_not_mistaken_for_corruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader can catch a live writer half way through a line. If the reader then looked past
    # that half line, it could find the line completed and another after it, and call it
    # corruption. Make the writer finish exactly then: right after the half line was read.
    folder, lines = _session(tmp_path)
    path = folder / "events.jsonl"
    head, rest = lines[-1][:20], lines[-1][20:]
    path.write_bytes(b"".join(lines[:-1]) + head)
    real_decode = _reader._decode

    def decode_then_writer_finishes(line: bytes) -> tuple[Any, str]:
        if line == head:
            with open(path, "ab") as f:
                f.write(rest + lines[-1])
        return real_decode(line)

    monkeypatch.setattr(_reader, "_decode", decode_then_writer_finishes)
    records = read(folder)
    assert len(records) == len(lines) - 1
    assert records.torn is not None and records.torn.length == len(head)
