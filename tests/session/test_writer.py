"""The writer: whole-line appends, batched syncs, durability modes, the lock, write failures."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from andon.base import (
    ErrorCode,
    LogCorrupted,
    LogWriteFailed,
    ManualClock,
    SessionError,
    SessionLive,
    naming_file,
)
from andon.session import (
    Completed,
    LlmRequest,
    SessionLog,
    StepEnd,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolErrorInfo,
    ToolResult,
    TurnEnd,
    TurnFailed,
    check,
    history,
    load,
    read,
    read_lock_holder,
)
from tests.session.helpers import WALL_START, Sim, snapshot, validate_request


def _begin(sim: Sim, *, calls: int = 2, called: int = 1) -> list[ToolCallBlock]:
    """A session with one turn whose step asked for ``calls`` tools and started ``called``."""
    sim.start()
    sim.queue("Build it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        ToolCallBlock(sim.call_id(i + 1), "bash", '{"command": "make"}') for i in range(calls)
    ]
    reply = sim.reply([TextBlock("Building."), *blocks])
    for call in reply[:called]:
        sim.tool_call(call)
        sim.started(call.call_id)
    return reply


def _write(log: SessionLog, sim: Sim) -> None:
    for _, data in sim.events:
        log.append(data)


def test_open_creates_owner_only_files_and_names_the_holder(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "session"
    sim = Sim()
    sim.start()
    with SessionLog.open(folder) as log:
        log.append(sim.events[0][1])
        assert folder.stat().st_mode & 0o777 == 0o700
        assert log.path.stat().st_mode & 0o777 == 0o600
        assert (folder / "lock").stat().st_mode & 0o777 == 0o600
        holder = read_lock_holder(folder)
        assert holder is not None and holder.pid == os.getpid() and holder.host
    holder = read_lock_holder(folder)
    assert holder is not None and holder.pid is None  # released: the note is cleared


def test_append_assigns_seq_and_time_from_the_clock(tmp_path: Path) -> None:
    clock = ManualClock(start=10.0, wall_start=WALL_START)
    sim = Sim()
    sim.start()
    sim.queue("hello")
    with SessionLog.open(tmp_path / "s", clock=clock) as log:
        first = log.append(sim.events[0][1])
        clock.advance(1.25)
        second = log.append(sim.events[1][1])
        assert (first.seq, first.time) == (0, WALL_START)
        assert (second.seq, second.time) == (1, WALL_START + 1.25)
        assert log.next_seq == 2
    lines = (tmp_path / "s" / "events.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1]


def test_first_record_must_be_session_start(tmp_path: Path) -> None:
    with SessionLog.open(tmp_path / "s") as log, pytest.raises(ValueError, match="session/start"):
        log.append(LlmRequest(1, 1, 1, "m"))
    assert list(tmp_path.iterdir()) == []  # nothing was written: no session, no temporary


def test_each_append_is_one_write_of_a_whole_line(tmp_path: Path) -> None:
    writes: list[bytes] = []

    def write(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return os.write(fd, data)

    sim = Sim()
    _begin(sim)
    with SessionLog.open(tmp_path / "s", write=write) as log:
        _write(log, sim)
    assert len(writes) == len(sim.events)
    assert all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes)
    assert b"".join(writes) == (tmp_path / "s" / "events.jsonl").read_bytes()


def test_a_bad_value_writes_nothing_and_the_log_goes_on(tmp_path: Path) -> None:
    sim = Sim()
    sim.start()
    with SessionLog.open(tmp_path / "s") as log:
        log.append(sim.events[0][1])
        with pytest.raises(ValueError, match="JSON"):
            log.append(ToolResult(1, 1, "c1-1-1", "x", False, float("inf")))
        assert log.next_seq == 1 and not log.failed
    assert len(read(tmp_path / "s")) == 1


def test_the_writer_follows_the_open_turn_and_step(tmp_path: Path) -> None:
    sim = Sim()
    _begin(sim, calls=1)
    with SessionLog.open(tmp_path / "s") as log:
        _write(log, sim)
        assert (log.last_turn, log.open_turn, log.open_step) == (1, 1, (1, 1))
        log.append(ToolResult(1, 1, "c1-1-1", "ok", False, 0.1))
        log.append(StepEnd(1, 1))
        assert log.open_step is None
        log.append(TurnEnd(1, Completed()))
        assert log.open_turn is None
    assert check(read(tmp_path / "s")) == []


class _GatedFsync:
    """An fsync that counts calls and can hold the first one until the test releases it."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        self.release.wait(10)
        os.fsync(fd)


async def test_barriers_arriving_during_a_sync_share_the_next_one(tmp_path: Path) -> None:
    fsync = _GatedFsync()
    sim = Sim()
    _begin(sim, calls=1, called=0)
    log = SessionLog.open(tmp_path / "s", fsync=fsync)
    try:
        log.append(sim.events[0][1])
        calls_at_open = fsync.calls  # the first record was synced before the folder got its name
        fsync.release.clear()
        fsync.entered.clear()
        first = asyncio.ensure_future(log.barrier())
        await asyncio.to_thread(fsync.entered.wait, 10)  # the first sync is running
        for _, data in sim.events[1:]:
            log.append(data)
        others = [asyncio.ensure_future(log.barrier()) for _ in range(5)]
        await asyncio.sleep(0)  # sleep-ok: one tick so the five waiters register
        assert not first.done()
        fsync.release.set()
        await asyncio.gather(first, *others)
        # one sync for the first barrier, one shared by the five that came during it
        assert fsync.calls - calls_at_open == 2
        await log.barrier()  # nothing new written: no sync needed
        assert fsync.calls - calls_at_open == 2
    finally:
        log.close()


@pytest.mark.parametrize(("mode", "per_append"), [("every-record", 1), ("none", 0)])
async def test_durability_modes(tmp_path: Path, mode: str, per_append: int) -> None:
    fsync = _GatedFsync()
    sim = Sim()
    _begin(sim)
    log = SessionLog.open(tmp_path / "s", durability=mode, fsync=fsync)  # type: ignore[arg-type]
    base = per_append  # the new folder entry is synced once, except in "none" mode
    assert fsync.calls == base
    _write(log, sim)
    await log.barrier()
    assert fsync.calls - base == per_append * len(sim.events)
    log.close()  # every record is durable already ("every-record") or never will be ("none")
    assert fsync.calls - base == per_append * len(sim.events)


async def test_close_syncs_only_what_no_barrier_covered(tmp_path: Path) -> None:
    fsync = _GatedFsync()
    sim = Sim()
    _begin(sim)
    covered = SessionLog.open(tmp_path / "a", fsync=fsync)
    _write(covered, sim)
    await covered.barrier()
    before = fsync.calls
    covered.close()  # the barrier synced every line: a run's exit pays no second fsync
    assert fsync.calls == before
    owed = SessionLog.open(tmp_path / "b", fsync=fsync)
    half = len(sim.events) // 2
    for _, data in sim.events[:half]:
        owed.append(data)
    await owed.barrier()
    for _, data in sim.events[half:]:
        owed.append(data)  # after the last barrier: only the close makes these durable
    before = fsync.calls
    owed.close()
    assert fsync.calls == before + 1


def _not_run_pairs(calls: list[ToolCallBlock]) -> list[ToolCall | ToolResult]:
    """What a stopped step writes for calls that never started: a tool/call and its result each."""
    out: list[ToolCall | ToolResult] = []
    for block in calls:
        out.append(ToolCall(1, 1, block.call_id, block.name, block.arguments))
        error = ToolErrorInfo("Aborted", "ABORTED_BEFORE_DISPATCH", "aborted before dispatch")
        out.append(ToolResult(1, 1, block.call_id, "Error", True, 0.0, error, ended_by="not-run"))
    return out


@pytest.mark.parametrize(("mode", "per_batch"), [("every-record", 1), ("barrier", 0)])
def test_a_batch_is_one_write_and_at_most_one_fsync(
    tmp_path: Path, mode: str, per_batch: int
) -> None:
    writes: list[bytes] = []

    def write(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return os.write(fd, data)

    fsync = _GatedFsync()
    sim = Sim()
    calls = _begin(sim, calls=500, called=0)
    folder = tmp_path / "s"
    log = SessionLog.open(folder, durability=mode, write=write, fsync=fsync)  # type: ignore[arg-type]
    _write(log, sim)
    before, syncs = len(writes), fsync.calls
    batch = _not_run_pairs(calls)
    written = log.append_many(batch)
    assert len(writes) == before + 1 and writes[-1].count(b"\n") == len(batch)
    assert fsync.calls - syncs == per_batch
    assert [r.seq for r in written] == list(range(len(sim.events), len(sim.events) + len(batch)))
    assert [r.data for r in written] == batch and log.next_seq == written[-1].seq + 1
    assert log.append_many([]) == []
    log.append(StepEnd(1, 1))
    log.append(TurnEnd(1, Completed()))
    log.close()
    records = read(folder)
    assert check(records) == []
    validate_request(history(records))


def test_a_batch_cut_by_a_full_disk_keeps_its_whole_lines_and_closes_the_rest(
    tmp_path: Path,
) -> None:
    sim = Sim()
    calls = _begin(sim, calls=6, called=0)
    batch = _not_run_pairs(calls)
    # The batch's write stops two and a half lines in (a short write at the limit), then ENOSPC.
    folder = tmp_path / "probe"
    with SessionLog.open(folder) as probe:
        _write(probe, sim)
        start = probe.path.stat().st_size
        probe.append_many(batch[:2])
        two = probe.path.stat().st_size - start
    folder = tmp_path / "s"
    log = SessionLog.open(folder, write=_recovering_write(len(sim.events), partial=two + 9))
    _write(log, sim)
    with pytest.raises(LogWriteFailed) as info:
        log.append_many(batch)
    assert info.value.errno == errno.ENOSPC
    assert log.failed and log.open_turn is None
    log.close()
    records = read(folder)
    assert records.torn is None and check(records) == []
    after = [r.data for r in records[len(sim.events) :]]
    assert after[:2] == batch[:2]  # the whole lines of the cut batch stand
    closed = [d for d in after[2:] if isinstance(d, ToolResult)]
    assert [d.call_id for d in closed] == [c.call_id for c in calls[1:]]
    assert isinstance(after[-1], TurnEnd) and isinstance(after[-1].reason, TurnFailed)
    validate_request(history(records))


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        SessionLog.open(tmp_path / "s", durability="sometimes")  # type: ignore[arg-type]


def test_a_second_writer_and_a_load_are_refused_while_the_log_is_open(tmp_path: Path) -> None:
    sim = Sim()
    _begin(sim)
    with SessionLog.open(tmp_path / "s") as log:
        _write(log, sim)
        before = snapshot(tmp_path / "s")
        with pytest.raises(SessionLive) as info:
            SessionLog.open(tmp_path / "s")
        assert info.value.pid == os.getpid()
        with pytest.raises(SessionLive, match=f"process {os.getpid()}"):
            load(tmp_path / "s")
        assert snapshot(tmp_path / "s") == before


def test_close_is_idempotent_and_appends_after_close_are_refused(tmp_path: Path) -> None:
    sim = Sim()
    sim.start()
    log = SessionLog.open(tmp_path / "s")
    log.append(sim.events[0][1])
    log.close()
    log.close()
    with pytest.raises(SessionError, match="closed"):
        log.append(sim.events[0][1])


async def test_aclose_syncs_in_the_background_thread(tmp_path: Path) -> None:
    sim = Sim()
    _begin(sim)
    async with SessionLog.open(tmp_path / "s") as log:
        _write(log, sim)
    assert log.closed
    assert len(read(tmp_path / "s")) == len(sim.events)


def test_reopening_a_crashed_log_repairs_it_under_the_same_lock(tmp_path: Path) -> None:
    sim = Sim()
    _begin(sim)
    with SessionLog.open(tmp_path / "s") as log:
        _write(log, sim)  # then "crash": no closers
    with SessionLog.open(tmp_path / "s") as log:
        assert log.loaded.repaired
        assert [r.type for r in log.loaded.closers] == [
            "tool/result",
            "tool/result",
            "step/end",
            "turn/end",
        ]
        assert log.next_seq == len(sim.events) + 5  # four closers and session/repaired
        assert (log.last_turn, log.open_turn) == (1, None)
    assert check(read(tmp_path / "s")) == []


# --- write failures (a fault-injecting seam; the real-limit test is in test_processes) ---------


def _failing_write(after: int, *, partial: int = 0, err: int = errno.ENOSPC) -> Callable[..., int]:
    """os.write that works ``after`` times, then writes ``partial`` bytes of the next line (a short
    write, as at a disk limit) and fails from then on."""
    state = {"n": 0, "short": False}

    def write(fd: int, data: bytes) -> int:
        state["n"] += 1
        if state["n"] <= after:
            return os.write(fd, data)
        if partial and not state["short"]:
            state["short"] = True
            return os.write(fd, data[:partial])
        raise OSError(err, os.strerror(err))

    return write


def _recovering_write(after: int, *, partial: int) -> Callable[..., int]:
    """Fails once (after a short write), then works again: the disk had room for closers."""
    state = {"n": 0}

    def write(fd: int, data: bytes) -> int:
        state["n"] += 1
        if state["n"] <= after:
            return os.write(fd, data)
        if state["n"] == after + 1:
            return os.write(fd, data[:partial])
        if state["n"] == after + 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    return write


def test_a_failed_write_is_cut_back_and_the_turn_closed_with_log_write_failed(
    tmp_path: Path,
) -> None:
    sim = Sim()
    calls = _begin(sim)
    folder = tmp_path / "s"
    log = SessionLog.open(folder, write=_recovering_write(len(sim.events), partial=17))
    _write(log, sim)
    with pytest.raises(LogWriteFailed) as info:
        log.append(ToolResult(1, 1, calls[0].call_id, "x" * 5000, False, 1.0))
    assert info.value.errno == errno.ENOSPC
    assert log.failed and log.open_turn is None
    with pytest.raises(LogWriteFailed):
        log.append(StepEnd(1, 1))
    with pytest.raises(LogWriteFailed):
        asyncio.run(log.barrier())
    log.close()

    records = read(folder)
    assert records.torn is None  # the 17 bytes of the short write were cut off
    assert check(records) == []
    closers = [r.to_dict()["data"] for r in records[len(sim.events) :]]
    assert [c.get("call_id") for c in closers[:2]] == [calls[0].call_id, calls[1].call_id]
    assert closers[0]["error"]["code"] == ErrorCode.TOOL_OUTCOME_UNKNOWN
    assert closers[0]["content"].endswith("Do not retry blindly.")
    assert closers[1]["error"]["code"] == ErrorCode.TOOL_NOT_STARTED
    assert closers[2] == {"turn": 1, "step": 1}
    assert closers[3]["reason"]["kind"] == "error"
    assert closers[3]["reason"]["error"]["code"] == "LOG_WRITE_FAILED"
    assert isinstance(records[-1].data, TurnEnd) and isinstance(records[-1].data.reason, TurnFailed)
    validate_request(history(records))
    assert not load(folder).repaired  # balanced: nothing to do


def test_when_even_the_closers_fail_the_log_stays_loadable(tmp_path: Path) -> None:
    sim = Sim()
    calls = _begin(sim)
    folder = tmp_path / "s"
    log = SessionLog.open(folder, write=_failing_write(len(sim.events), partial=40))
    _write(log, sim)
    with pytest.raises(LogWriteFailed):
        log.append(ToolResult(1, 1, calls[0].call_id, "x", False, 1.0))
    assert log.open_turn == 1  # could not close it
    log.close()
    assert len(read(folder)) == len(sim.events) and read(folder).torn is None
    loaded = load(folder)
    assert loaded.repaired and check(loaded.events) == []
    assert loaded.events[-2].to_dict()["data"]["reason"] == {"kind": "interrupted"}


async def test_a_failed_sync_fails_the_barrier_and_closes_the_turn(tmp_path: Path) -> None:
    sim = Sim()
    _begin(sim, calls=1)
    state = {"fail": False}

    def fsync(fd: int) -> None:
        if state["fail"]:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    folder = tmp_path / "s"
    log = SessionLog.open(folder, fsync=fsync)
    _write(log, sim)
    state["fail"] = True
    with pytest.raises(LogWriteFailed) as info:
        await log.barrier()
    assert info.value.errno == errno.EIO
    with pytest.raises(LogWriteFailed):
        log.append(StepEnd(1, 1))
    log.close()
    records = read(folder)
    assert check(records) == []
    assert records[-1].to_dict()["data"]["reason"]["error"]["code"] == "LOG_WRITE_FAILED"


def test_a_failed_sync_in_every_record_mode_fails_the_append(tmp_path: Path) -> None:
    sim = Sim()
    _begin(sim, calls=1)
    state = {"n": 0}

    def fsync(fd: int) -> None:
        state["n"] += 1
        if state["n"] > len(sim.events):
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    folder = tmp_path / "s"
    log = SessionLog.open(folder, durability="every-record", fsync=fsync)
    state["n"] = 0  # ignore the sync of the new folder entry
    _write(log, sim)
    with pytest.raises(LogWriteFailed):
        log.append(ToolResult(1, 1, "c1-1-1", "done", False, 1.0))
    log.close()
    records = read(folder)
    assert check(records) == []  # the written result stands; step and turn are closed
    assert records[-1].to_dict()["data"]["reason"]["kind"] == "error"


def test_opening_a_corrupt_log_fails_and_releases_the_lock(tmp_path: Path) -> None:
    from tests.session.helpers import copy_fixture

    folder = copy_fixture("corrupt-middle", tmp_path)
    before = snapshot(folder)
    with pytest.raises(LogCorrupted):
        SessionLog.open(folder)
    assert {k: v for k, v in snapshot(folder).items() if k != "lock"} == before
    holder = read_lock_holder(folder)
    assert holder is not None and holder.pid is None  # not held any more


def test_loading_something_that_is_not_a_session_is_a_session_error(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="not a session folder"):
        load(tmp_path / "missing")
    with pytest.raises(SessionError, match="holds no session log"):
        load(tmp_path)


# --- a full disk names the file (/dev/full: every write fails with ENOSPC, no root needed) ----

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")


@needs_dev_full
def test_a_full_disk_under_the_lock_file_names_it(tmp_path: Path) -> None:
    sim = Sim()
    sim.start()
    folder = tmp_path / "s"
    with SessionLog.open(folder) as log:
        _write(log, sim)
    (folder / "lock").unlink()
    (folder / "lock").symlink_to("/dev/full")
    with pytest.raises(OSError, match="No space left") as info:
        SessionLog.open(folder)
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(folder / "lock")
    assert str(folder / "lock") in str(info.value)


@needs_dev_full
def test_a_full_disk_under_the_log_names_it(tmp_path: Path) -> None:
    sim = Sim()
    sim.start()
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "events.jsonl").symlink_to("/dev/full")  # an empty log on a full disk
    log = SessionLog.open(folder)
    with pytest.raises(LogWriteFailed) as info:
        _write(log, sim)
    log.close()
    assert info.value.errno == errno.ENOSPC
    assert f"writing the session log {folder / 'events.jsonl'} failed" in str(info.value)


@needs_dev_full
def test_naming_file_names_a_descriptor_error_and_keeps_a_named_one() -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError, match=r"events\.jsonl") as info, naming_file("/x/events.jsonl"):
            os.write(fd, b"x")
    finally:
        os.close(fd)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, "/x/events.jsonl")
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(FileNotFoundError) as missing, naming_file("/x/other"):
        os.open("/nonexistent/andon-test", os.O_RDONLY)
    assert missing.value.filename == "/nonexistent/andon-test"  # already named: unchanged
