"""An append is atomic against asynchronous exceptions (a ``KeyboardInterrupt`` from a signal
handler, in a program that embeds andon without the CLI's handlers).

Wherever the interrupt lands, once ``append`` has raised, either the record is whole in the file
and the writer counts it, or nothing of it is in the file and the writer is as it was: the log
parses, seqs stay unique and contiguous, and the next append gets the right seq.

Two kinds of test: the write seam raising ``KeyboardInterrupt`` itself (an interrupt landing right
after the ``write`` syscall wrote the line, or part of it), and the writer's probe, a test seam
called at each named point of an append, raising at each point in turn (and, while the writer
mends the state, at each point of the mending too).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from andon.base import LogWriteFailed
from andon.session import (
    Completed,
    Record,
    SessionLog,
    StepEnd,
    TextBlock,
    ToolCallBlock,
    ToolResult,
    TurnEnd,
    _repair,
    check,
    load,
    read,
    repair,
)
from andon.session._tail import Tail
from tests.session.helpers import Sim, copy_fixture

DURABILITIES = ["barrier", "every-record", "none"]


def _prefix() -> tuple[Sim, ToolCallBlock]:
    """A session inside a step whose one tool call has started: its result is what we append."""
    sim = Sim()
    sim.start()
    sim.queue("Build it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    (call,) = sim.reply([TextBlock("Building."), ToolCallBlock(sim.call_id(1), "bash", "{}")])
    sim.tool_call(call)
    sim.started(call.call_id)
    return sim, call


def _result(call: ToolCallBlock) -> ToolResult:
    return ToolResult(1, 1, call.call_id, "x" * 3000 + "\n[exit code 0]", False, 1.0)


def _finish(log: SessionLog, call: ToolCallBlock, *, written: bool) -> None:
    """Go on as a caller would after the interrupt: write the result if it is not there yet."""
    seq = log.next_seq
    if not written:
        assert log.append(_result(call)).seq == seq
        seq += 1
    assert log.append(StepEnd(1, 1)).seq == seq
    assert log.append(TurnEnd(1, Completed())).seq == seq + 1


def _assert_whole(folder: Path, log: SessionLog) -> None:
    """The file holds exactly the records the writer counts, each whole, seqs 0, 1, ..."""
    records = read(folder)
    assert records.torn is None, "a partial line was left in the log"
    assert [r.seq for r in records] == list(range(log.next_seq))
    assert folder.joinpath("events.jsonl").read_bytes().endswith(b"\n")


def _assert_final(folder: Path, prefix: int) -> None:
    records = read(folder)
    assert records.torn is None
    assert [r.seq for r in records] == list(range(prefix + 3))
    assert [type(r.data) for r in records[prefix:]] == [ToolResult, StepEnd, TurnEnd]
    assert check(records) == []
    assert not load(folder).repaired


# --- the write seam raising: no probe needed, so these run against any writer ---------------


def _interrupting_write(*, part: float) -> tuple[Callable[[int, bytes], int], dict[str, bool]]:
    """os.write that, once armed, writes ``part`` of the next line and then raises
    KeyboardInterrupt: the interrupt lands after the syscall returned, before anyone saw its count.
    """
    state = {"armed": False}

    def write(fd: int, data: bytes) -> int:
        if not state["armed"]:
            return os.write(fd, data)
        state["armed"] = False
        os.write(fd, data[: int(len(data) * part)])
        raise KeyboardInterrupt

    return write, state


@pytest.mark.parametrize("durability", DURABILITIES)
def test_an_interrupt_after_the_line_was_written_keeps_it_and_counts_it(
    tmp_path: Path, durability: str
) -> None:
    sim, call = _prefix()
    folder = tmp_path / "s"
    write, state = _interrupting_write(part=1.0)
    log = SessionLog.open(folder, durability=durability, write=write)  # type: ignore[arg-type]
    for _, data in sim.events:
        log.append(data)
    state["armed"] = True
    with pytest.raises(KeyboardInterrupt):
        log.append(_result(call))
    # The kernel has the whole line (a reader may already have seen it): it stands, and is counted.
    assert log.next_seq == len(sim.events) + 1
    _assert_whole(folder, log)
    _finish(log, call, written=True)
    log.close()
    _assert_final(folder, len(sim.events))


@pytest.mark.parametrize("durability", DURABILITIES)
def test_an_interrupt_after_a_short_write_leaves_no_partial_line(
    tmp_path: Path, durability: str
) -> None:
    sim, call = _prefix()
    folder = tmp_path / "s"
    write, state = _interrupting_write(part=0.5)
    log = SessionLog.open(folder, durability=durability, write=write)  # type: ignore[arg-type]
    for _, data in sim.events:
        log.append(data)
    size = folder.joinpath("events.jsonl").stat().st_size
    state["armed"] = True
    with pytest.raises(KeyboardInterrupt):
        log.append(_result(call))
    # Half a line was never acknowledged: it is cut off before append raises, not left for a
    # later line to turn into corruption.
    assert folder.joinpath("events.jsonl").stat().st_size == size
    assert log.next_seq == len(sim.events)
    _assert_whole(folder, log)
    _finish(log, call, written=False)
    log.close()
    _assert_final(folder, len(sim.events))


# --- the probe: an interrupt at every named point, in turn --------------------------------------

# From these points on the line is whole in the file: it must stand and be counted.
WRITTEN_FROM = {"written", "synced", "committed", "settled"}


@dataclass
class Probe:
    """Once armed, records each point the writer passes and raises KeyboardInterrupt at the calls
    whose index (from arming) is in ``at``."""

    at: set[int] = field(default_factory=set)
    armed: bool = False
    seen: list[str] = field(default_factory=list)

    def __call__(self, point: str) -> None:
        if not self.armed:
            return
        self.seen.append(point)
        if len(self.seen) - 1 in self.at:
            raise KeyboardInterrupt


@dataclass
class Seams:
    """The file seams: a write that can be made short once, or fail once (after a short write),
    and an fsync that remembers how big the file was at each sync."""

    short: bool = False
    fail: bool = False
    synced: list[int] = field(default_factory=list)
    _armed: str = ""

    def arm(self) -> None:
        self._armed = "fail" if self.fail else "short" if self.short else ""

    def write(self, fd: int, data: bytes) -> int:
        armed = self._armed
        if armed == "failing":  # the rest of the line, after the short write: the disk is full
            self._armed = ""
            raise OSError(errno.ENOSPC, "No space left on device")
        if armed in ("short", "fail"):
            self._armed = "failing" if armed == "fail" else ""
            return os.write(fd, data[: len(data) // 2])  # a short write: the caller writes on
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        self.synced.append(os.fstat(fd).st_size)


@dataclass
class Run:
    """A log in its own folder, written up to the tool result, with the result appended under
    the probe."""

    folder: Path
    durability: str
    seams: Seams
    probe: Probe = field(default_factory=Probe)

    def __post_init__(self) -> None:
        self.sim, self.call = _prefix()
        self.log = SessionLog.open(
            self.folder,
            durability=self.durability,  # type: ignore[arg-type]
            write=self.seams.write,
            fsync=self.seams.fsync,
            probe=self.probe,
        )
        for _, data in self.sim.events:
            self.log.append(data)
        self.prefix = len(self.sim.events)

    def append_result(self, at: set[int]) -> None:
        self.probe.at, self.probe.armed = at, True
        self.seams.arm()
        try:
            self.log.append(_result(self.call))
        finally:
            self.probe.armed = False

    async def assert_consistent(self, *, written: bool, then: str = "") -> None:
        """Check the log after the interrupt. With no ``then``, append raised after mending the
        state (one interrupt), so the file is right before the writer is touched again. Otherwise
        a second interrupt may have stopped the mending, and ``then`` is the first call to touch
        the writer: each entry point must mend what is left before anything else."""
        log, size = self.log, self.folder.joinpath("events.jsonl")
        if not then:
            records = read(self.folder)
            assert records.torn is None, "append raised leaving a partial line"
            assert len(records) == self.prefix + written
            assert log.next_seq == self.prefix + written
            _assert_whole(self.folder, log)
            if written and self.durability == "every-record":
                assert self.seams.synced[-1] == size.stat().st_size  # a counted record is synced
            if written and self.durability == "barrier":
                await log.barrier()  # the sync thread counts the record: the barrier covers it
                assert self.seams.synced[-1] == size.stat().st_size
        elif then == "next_seq":
            assert log.next_seq == self.prefix + written
            _assert_whole(self.folder, log)
        elif then == "barrier":
            await log.barrier()
            records = read(self.folder)
            assert records.torn is None and len(records) == self.prefix + written
            if written and self.durability == "barrier":
                # The barrier counted the whole line the interrupt left uncounted, so it synced.
                assert self.seams.synced[-1] == size.stat().st_size
        elif then == "close":
            log.close()
            records = read(self.folder)
            assert records.torn is None and len(records) == self.prefix + written
            loaded = load(self.folder)  # the open turn is repair's to close, not a torn line
            assert loaded.report.torn is None and check(loaded.events) == []
            return
        # The next appends get the next seqs: the result (unless it is there), step/end, turn/end.
        seq = self.prefix
        if not written:
            assert log.append(_result(self.call)).seq == seq
        assert log.append(StepEnd(1, 1)).seq == seq + 1
        assert log.append(TurnEnd(1, Completed())).seq == seq + 2
        log.close()
        _assert_final(self.folder, self.prefix)


def _points(tmp_path: Path, durability: str, seams: Seams) -> list[str]:
    clean = Run(tmp_path / "clean", durability, seams)
    if seams.fail:
        with pytest.raises(LogWriteFailed):
            clean.append_result(set())
    else:
        clean.append_result(set())
    clean.log.close()
    return clean.probe.seen


@pytest.mark.parametrize("short", [False, True], ids=["one-write", "short-write"])
@pytest.mark.parametrize("durability", DURABILITIES)
async def test_an_interrupt_at_any_point_of_an_append_leaves_log_and_writer_agreeing(
    tmp_path: Path, durability: str, short: bool
) -> None:
    points = _points(tmp_path, durability, Seams(short=short))
    expected = ["prepared", "in-flight", "written", "committed", "settled"]
    if short:
        expected.insert(2, "partly-written")
    if durability == "every-record":
        expected.insert(expected.index("written") + 1, "synced")
    assert points == expected
    for k, point in enumerate(points):
        run = Run(tmp_path / f"at-{k}", durability, Seams(short=short))
        with pytest.raises(KeyboardInterrupt):
            run.append_result({k})
        await run.assert_consistent(written=point in WRITTEN_FROM)


@pytest.mark.parametrize("then", ["append", "next_seq", "barrier", "close"])
@pytest.mark.parametrize("short", [False, True], ids=["one-write", "short-write"])
@pytest.mark.parametrize("durability", DURABILITIES)
async def test_a_second_interrupt_while_the_writer_mends_the_first_is_mended_by_the_next_call(
    tmp_path: Path, durability: str, short: bool, then: str
) -> None:
    points = _points(tmp_path, durability, Seams(short=short))
    mended = 0
    for k, point in enumerate(points):
        first = Run(tmp_path / f"at-{k}", durability, Seams(short=short))
        with pytest.raises(KeyboardInterrupt):
            first.append_result({k})
        first.log.close()
        # The points append passes after the interrupt: those of mending it on the way out.
        for j in range(k + 1, len(first.probe.seen)):
            run = Run(tmp_path / f"at-{k}-{j}", durability, Seams(short=short))
            await run.log.barrier()  # synced up to here: only the interrupted line is not
            with pytest.raises(KeyboardInterrupt):
                run.append_result({k, j})
            await run.assert_consistent(written=point in WRITTEN_FROM, then=then)
            mended += 1
    assert mended >= 3  # the mending has points of its own, and the test reached them


async def test_an_interrupt_while_a_failed_append_closes_the_turn(tmp_path: Path) -> None:
    # The result's write is short and then fails (disk full): the writer cuts the half line off
    # and appends closers for the open step and turn. An interrupt lands at each point of that.
    points = _points(tmp_path, "barrier", Seams(fail=True))
    assert points[:3] == ["prepared", "in-flight", "partly-written"]
    assert points.count("committed") == 3  # the outcome-unknown result, step/end, turn/end
    for k in range(len(points)):
        run = Run(tmp_path / f"at-{k}", "barrier", Seams(fail=True))
        with pytest.raises(KeyboardInterrupt):
            run.append_result({k})
        _assert_whole(run.folder, run.log)
        if not run.log.failed:  # interrupted before the write failed: it fails now
            with pytest.raises(LogWriteFailed):
                run.log.append(_result(run.call))
            _assert_whole(run.folder, run.log)
        with pytest.raises(LogWriteFailed):
            run.log.append(StepEnd(1, 1))
        run.log.close()
        # What the closers did not close, repair does; no partial line was left for it to save.
        loaded = load(run.folder)
        assert loaded.report.torn is None
        assert [r.seq for r in loaded.events] == list(range(len(loaded.events)))
        assert check(loaded.events) == []
        assert isinstance(loaded.events[run.prefix].data, ToolResult)
        with SessionLog.open(run.folder) as again:
            assert again.next_seq == len(loaded.events)


def test_feeding_a_copy_of_the_tail_leaves_the_committed_one_as_it_was() -> None:
    # The writer computes the state after an append before it writes (Tail.fed); if that touched
    # the committed tail, an interrupt before the commit would leave a state the file disagrees
    # with. Every record kind that changes the open step, fed in turn.
    sim = Sim()
    sim.start()
    sim.queue("Build it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    blocks = [ToolCallBlock(sim.call_id(n), "bash", "{}") for n in (1, 2)]
    reply = sim.reply([TextBlock("Building."), *blocks])
    sim.tool_call(reply[0])
    sim.started(reply[0].call_id)
    sim.started(reply[0].call_id)  # a second process of the same call
    sim.result(reply[0].call_id, "ok")
    sim.end_step()
    sim.end_turn(Completed())
    records = [Record(seq, 0.0, data) for seq, (_, data) in enumerate(sim.events)]

    def state(tail: Tail) -> object:
        return (tail.next_seq, tail.open_turn, tail.last_turn, tail.step, tail.dangling())

    committed, replayed = Tail(), Tail()
    for record in records:
        before = state(committed)
        new = committed.fed(record)
        assert state(committed) == before, f"feeding a copy changed the tail ({record.type})"
        replayed.feed(record)
        assert state(new) == state(replayed)
        committed = new


# --- crash repair's own appends ------------------------------------------------------------------


@pytest.mark.parametrize("part", [0.0, 0.5, 1.0], ids=["before", "half", "whole"])
def test_an_interrupt_while_repair_appends_its_closers_leaves_whole_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: float
) -> None:
    # Repair keeps no state across loads (the next one reads the file again), so the danger is
    # only its own half line: the next load would take it for a crash's torn write.
    template = copy_fixture("crashed-mid-tool", tmp_path / "template")
    appended = len(repair(template, dry_run=True).appended)
    prefix = len(read(template))
    assert appended >= 3
    real = _repair._write_all
    for n in range(appended):
        folder = tmp_path / f"at-{n}"
        shutil.copytree(template, folder)
        calls = {"n": 0}

        def write_all(fd: int, data: bytes, n: int = n, calls: dict[str, int] = calls) -> None:
            calls["n"] += 1
            if calls["n"] == n + 1:  # the n-th closer: part of it, then the interrupt
                real(fd, data[: int(len(data) * part)])
                raise KeyboardInterrupt
            real(fd, data)

        monkeypatch.setattr(_repair, "_write_all", write_all)
        with pytest.raises(KeyboardInterrupt):
            load(folder)
        monkeypatch.setattr(_repair, "_write_all", real)
        records = read(folder)
        assert records.torn is None, "repair left half a line of its own"
        assert len(records) == prefix + n + (part == 1.0)
        loaded = load(folder)  # the next load completes the repair
        assert loaded.report.torn is None and not list(folder.glob("events.jsonl.torn-*"))
        assert [r.seq for r in loaded.events] == list(range(len(loaded.events)))
        assert check(loaded.events) == []
