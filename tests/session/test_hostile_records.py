"""Hostile log lines: refused by the reader with one line naming where, never a RecursionError,
an OverflowError, or a process id handed on to ``kill``.

The logs are real files; the process-touching calls are watched, so a test would fail if a bad
``tool/started`` got as far as a signal.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from andon.base import LogCorrupted, session_id
from andon.session import (
    Record,
    ToolStarted,
    iter_records,
    kill_in_flight,
    read,
    repair,
)
from andon.session._leftovers import StartedCall, find_leftovers
from andon.session._reader import MAX_DEPTH
from tests.session.helpers import Sim, lines_of, write_crashed

PID_LIMIT = 1 << 22  # Linux's PID_MAX_LIMIT


def _first_lines() -> list[bytes]:
    """A session/start and its first splice: the valid head every hostile log starts with."""
    sim = Sim()
    sim.start()
    sim.queue("hi")
    return lines_of(sim.data())


def _log(tmp_path: Path, *lines: bytes) -> Path:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "events.jsonl").write_bytes(b"".join(lines))
    return folder


def _log_bytes(folder: Path) -> bytes:
    return (folder / "events.jsonl").read_bytes()


def _nested(depth: int) -> bytes:
    """An ignorable record whose value nests ``depth`` levels in all (the record counts as 1)."""
    inner = depth - 2  # the record object and its data object
    value = b"[" * inner + b"]" * inner
    return b'{"seq":2,"time":1.5,"type":"x/new","ignorable":true,"data":{"a":' + value + b"}}\n"


def _refused(folder: Path) -> LogCorrupted:
    with pytest.raises(LogCorrupted) as info:
        read(folder)
    message = str(info.value)
    assert "\n" not in message
    return info.value


# --- nesting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_line_nested_100000_deep_is_corruption_wherever_it_is(tmp_path: Path, where: str) -> None:
    head = _first_lines()
    deep = b'{"seq":2,"time":1,"type":"user/message-entered","data":'
    deep += b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    # As the last line it is still not torn: the writer never produced it, so repair must not
    # set it aside as an append that did not finish.
    tail = [deep] if where == "last" else [deep, head[-1]]
    folder = _log(tmp_path, *head, *tail)
    before = _log_bytes(folder)
    error = _refused(folder)
    offset = sum(map(len, head))
    assert f"line {len(head) + 1} (byte offset {offset}) is nested too deeply" in str(error)
    assert (error.line, error.offset) == (len(head) + 1, offset)
    with pytest.raises(LogCorrupted):
        repair(folder)
    assert _log_bytes(folder) == before  # repair takes the lock, and writes nothing


def test_an_unterminated_deep_last_line_is_still_a_torn_tail(tmp_path: Path) -> None:
    # On a live log the rest of the line may be arriving: it is never parsed, so never refused.
    head = _first_lines()
    folder = _log(tmp_path, *head, b'{"seq":2,"data":' + b"[" * 100_000)
    records = read(folder)
    assert len(records) == len(head) and records.torn is not None


def test_nesting_up_to_the_limit_is_read_and_one_more_level_is_refused(tmp_path: Path) -> None:
    head = _first_lines()
    ok = _log(tmp_path, *head, _nested(MAX_DEPTH))
    record = read(ok)[-1]
    assert record.ignorable and json.dumps(record.to_dict())  # and it can be written back out
    (ok / "events.jsonl").write_bytes(b"".join([*head, _nested(MAX_DEPTH + 1)]))
    assert "nested too deeply" in str(_refused(ok))


def test_brackets_inside_strings_are_not_nesting(tmp_path: Path) -> None:
    # More brackets than the limit, all in text: the count only decides whether to walk.
    head = _first_lines()
    text = json.dumps("[{" * 500).encode()
    line = b'{"seq":2,"time":1.5,"type":"x/new","ignorable":true,"data":{"a":' + text + b"}}\n"
    assert len(read(_log(tmp_path, *head, line))) == len(head) + 1


# --- numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [b"1e400", b"-1e400"])
def test_a_float_too_large_to_hold_is_corruption_even_at_the_end(
    tmp_path: Path, number: bytes
) -> None:
    head = _first_lines()
    line = b'{"seq":2,"time":' + number + b',"type":"turn/start","data":{"turn":1}}\n'
    error = _refused(_log(tmp_path, *head, line))
    assert f"holds the number {number.decode()}, too large for a float" in str(error)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"seq": True}, "record.seq must be an integer, not a boolean"),
        ({"time": True}, "record 2.time must be a number, not a boolean"),
        ({"time": -1.0}, "record 2.time must be a number of seconds from 0 to"),
        ({"time": 1e300}, "record 2.time must be a number of seconds from 0 to"),
        ({"time": 10**30}, "record 2.time must be a number of seconds from 0 to"),
    ],
)
def test_a_bad_envelope_names_the_record_and_field(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    record = {"seq": 2, "time": 1.5, "type": "turn/start", "data": {"turn": 1}} | fields
    line = json.dumps(record).encode() + b"\n"
    assert message in str(_refused(_log(tmp_path, *_first_lines(), line)))


@pytest.mark.parametrize("time", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_from_a_dict_are_refused_too(time: float) -> None:
    # The API path (``as_records``) never went through the decoder that refuses them.
    with pytest.raises(ValueError, match=r"record 0\.time must be a number of seconds"):
        Record.from_dict({"seq": 0, "time": time, "type": "turn/start", "data": {"turn": 1}})


@pytest.mark.parametrize(
    ("exit_status", "message"),
    [
        ({"code": -1, "signal": None}, "exit.code must be an exit code from 0 to 255, not -1"),
        ({"code": 256, "signal": None}, "exit.code must be an exit code from 0 to 255, not 256"),
        ({"code": None, "signal": 0}, "exit.signal must be a signal number from 1 to"),
        ({"code": None, "signal": signal.NSIG}, "exit.signal must be a signal number from 1 to"),
        ({"code": None, "signal": -9}, "exit.signal must be a signal number from 1 to"),
    ],
)
def test_an_exit_status_no_process_can_have_is_refused(
    exit_status: dict[str, Any], message: str
) -> None:
    data = {"turn": 1, "step": 1, "call_id": "c1-1-1", "content": "", "is_error": True}
    data |= {"exit": exit_status, "duration": 0.1}
    with pytest.raises(ValueError, match=re.escape(message)):
        Record.from_dict({"seq": 9, "time": 1.0, "type": "tool/result", "data": data})


@pytest.mark.parametrize("status", [{"code": 0, "signal": None}, {"code": 255, "signal": None}])
def test_every_real_exit_status_is_read(status: dict[str, Any]) -> None:
    data = {"turn": 1, "step": 1, "call_id": "c1-1-1", "content": "", "is_error": False}
    data |= {"exit": status, "duration": 0.1}
    Record.from_dict({"seq": 9, "time": 1.0, "type": "tool/result", "data": data})


# --- process ids --------------------------------------------------------------------------------


def _crashed_with(folder: Path, **change: Any) -> str:
    """A log that ends inside call c1-1-1, whose tool/started (on this host) has ``change``."""
    sid = session_id()
    fields: dict[str, Any] = {"pid": 4301, "pgid": 4301, "create_time": 1764661201.12} | change
    started = ToolStarted(1, 1, "c1-1-1", "w1", socket.gethostname(), **fields)
    write_crashed(folder, sid, started)
    return sid


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """Every kill, killpg and pidfd_open the code under test attempts (none is carried out)."""
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def watch(name: str) -> Any:
        def call(*args: Any) -> Any:
            calls.append((name, args))
            raise ProcessLookupError(name)

        return call

    for name in ("kill", "killpg", "pidfd_open"):
        monkeypatch.setattr(os, name, watch(name))
    return calls


BAD_IDS = [
    ("pid", -5),
    ("pid", 0),
    ("pid", True),
    ("pid", PID_LIMIT),
    ("pid", 2**70),
    ("pgid", -1),
    ("pgid", 0),
    ("pgid", PID_LIMIT + 1),
    ("create_time", -1.0),
]


@pytest.mark.parametrize(("field", "value"), BAD_IDS)
def test_a_tool_started_with_a_bad_identity_is_refused_and_nothing_is_signalled(
    tmp_path: Path, field: str, value: object, signals: list[tuple[str, tuple[Any, ...]]]
) -> None:
    folder = tmp_path / "s"
    _crashed_with(folder, **{field: value})
    before = _log_bytes(folder)
    error = _refused(folder)
    seq = len(before.splitlines()) - 1
    assert f"record {seq} (tool/started) data.{field} must be" in str(error)
    with pytest.raises(LogCorrupted):
        repair(folder)
    with pytest.raises(LogCorrupted):
        repair(folder, dry_run=True)
    with pytest.raises(LogCorrupted):
        list(iter_records(folder))
    assert signals == []
    assert _log_bytes(folder) == before


def test_a_good_identity_still_reaches_repair(
    tmp_path: Path, signals: list[tuple[str, tuple[Any, ...]]]
) -> None:
    # The control: the same log with a plausible pid is read, and repair closes the call (the
    # recorded leader is long gone, so nothing is signalled either).
    folder = tmp_path / "s"
    _crashed_with(folder)
    assert repair(folder).repaired
    assert signals == []


@pytest.mark.parametrize(("field", "value"), [("pid", -5), ("pgid", 0), ("create_time", math.inf)])
def test_leftovers_of_a_bad_in_memory_record_touch_nothing(
    field: str, value: object, signals: list[tuple[str, tuple[Any, ...]]]
) -> None:
    # A ToolStarted built in memory never met the reader: the leftover finder guards itself.
    fields: dict[str, Any] = {"pid": 4301, "pgid": 4301, "create_time": 1.0} | {field: value}
    started = ToolStarted(1, 1, "c1-1-1", "w1", socket.gethostname(), **fields)
    plan = find_leftovers([StartedCall("c1-1-1", None, started)])
    assert plan.processes == ()
    assert signals == []


def test_kill_in_flight_never_sees_a_bad_pid(
    tmp_path: Path, signals: list[tuple[str, tuple[Any, ...]]]
) -> None:
    folder = tmp_path / "s"
    _crashed_with(folder, pid=-5)
    with pytest.raises(LogCorrupted):
        kill_in_flight(read(folder))
    assert signals == []


@pytest.mark.parametrize("pid", [0, -1, PID_LIMIT])
def test_a_session_start_pid_must_be_a_process_id(pid: int) -> None:
    sim = Sim()
    sim.start()
    record = json.loads(lines_of(sim.data())[0])
    record["data"]["pid"] = pid
    with pytest.raises(ValueError, match=r"record 0 \(session/start\) data\.pid must be a process"):
        Record.from_dict(record)
