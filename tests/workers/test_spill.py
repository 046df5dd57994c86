"""The spill file has a cap, and a spill failure never changes how a call that ran is reported."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import psutil

from andon.base import AbortController, ErrorCode, ManualClock, User
from tests.workers.support import Recorder, bash, running_pool, start

CAP = 1024 * 1024


async def test_a_runaway_writer_stops_at_the_cap_and_the_result_names_what_was_elided(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with running_pool("subreaper", clock=clock, session_dir=tmp_path, spill_cap=CAP) as (
        _,
        executor,
    ):
        task, rec, _ = await start(executor, bash("c1-1-1", "exec yes", timeout=10))
        await rec.wait_until(lambda: len(rec.output) > 3 * CAP)
        clock.advance(10.0)  # the call's own timeout
        outcome = await task
    spilled = tmp_path / "tool-output" / "c1-1-1.log"
    assert outcome.ended_by == "timeout-interrupt"
    assert outcome.error is not None and outcome.error.code is ErrorCode.TOOL_TIMEOUT
    assert spilled.stat().st_size == CAP
    assert spilled.read_bytes()[:4] == b"y\ny\n"
    assert outcome.output_bytes > 3 * CAP
    elided = outcome.output_bytes - CAP
    assert f"{elided} bytes elided from tool-output/c1-1-1.log" in outcome.content


async def test_a_full_disk_while_spilling_still_reports_the_call_as_run(tmp_path: Path) -> None:
    folder = tmp_path / "tool-output"
    folder.mkdir()
    # Every write to /dev/full fails with ENOSPC: a real full disk, without filling one.
    (folder / "c1-1-1.log").symlink_to("/dev/full")
    async with running_pool("subreaper", session_dir=tmp_path) as (_, executor):
        outcome = await executor.execute(
            bash("c1-1-1", "head -c 200000 /dev/zero | tr '\\0' x; echo; exit 3"),
            AbortController().signal,
        )
    assert outcome.ended_by == "exit"
    assert outcome.exit_code == 3
    assert outcome.ran
    assert outcome.error is None  # not INTERNAL, not "not run": the command ran, and failed
    spill = folder / "c1-1-1.log"
    assert f"could not write {spill}: No space left on device" in outcome.content  # named
    assert outcome.content.rstrip().endswith("not stored]")
    assert outcome.output_bytes == 200001


async def test_a_wiped_session_folder_does_not_fail_the_call(tmp_path: Path) -> None:
    session = tmp_path / "session"
    session.mkdir()
    async with running_pool("subreaper", session_dir=session) as (_, executor):
        shutil.rmtree(session)  # a tool (or a person) wiped the workspace
        outcome = await executor.execute(
            bash("c1-1-1", "head -c 100000 /dev/zero | tr '\\0' x"), AbortController().signal
        )
    assert outcome.ended_by == "exit" and outcome.exit_code == 0
    assert outcome.error is None
    assert f"could not create {session / 'tool-output' / 'c1-1-1.log'}:" in outcome.content
    assert not os.path.exists(session)


GIB = 1024 * 1024 * 1024
RSS_BOUND = 96 * 1024 * 1024
"""How much either process may grow while 1 GiB flows through it: the output window (4 MiB a
side) plus allocator slack; without back-pressure the worker grew by ~800 MiB."""


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


class _RssWatch(Recorder):
    """Samples the worker's and this process's RSS as output arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.worker = 0
        self.peak = (0, 0)
        self.chunks = 0
        self.total = 0

    def on_output(self, call_id: str, data: bytes) -> None:
        self.chunks += 1
        self.total += len(data)
        if self.chunks % 256 == 0 and self.worker:
            self.peak = (max(self.peak[0], _rss(self.worker)), max(self.peak[1], _rss(os.getpid())))
        self._poke()


async def test_a_gigabyte_of_output_keeps_both_sides_memory_bounded(tmp_path: Path) -> None:
    async with running_pool("subreaper", session_dir=tmp_path, spill_cap=16 * 1024 * 1024) as (
        pool,
        executor,
    ):
        (worker,) = pool.workers.values()
        watch = _RssWatch()
        watch.worker = worker
        base = (_rss(worker), _rss(os.getpid()))
        outcome = await executor.execute(
            bash("c1-1-1", f"head -c {GIB} /dev/zero"), AbortController().signal, watch
        )
    assert outcome.ended_by == "exit" and outcome.exit_code == 0
    assert outcome.output_bytes == GIB
    assert (tmp_path / "tool-output" / "c1-1-1.log").stat().st_size == 16 * 1024 * 1024
    assert watch.peak[0] - base[0] < RSS_BOUND, (watch.peak, base)
    assert watch.peak[1] - base[1] < RSS_BOUND, (watch.peak, base)


async def test_a_flood_can_be_cancelled_mid_flight(tmp_path: Path) -> None:
    async with running_pool("subreaper", session_dir=tmp_path) as (_, executor):
        watch = _RssWatch()
        controller = AbortController()
        task = asyncio.create_task(
            executor.execute(
                bash("c1-1-1", f"head -c {8 * GIB} /dev/zero"), controller.signal, watch
            )
        )
        watch.follow(task)
        await watch.wait_until(lambda: watch.total > 64 * 1024 * 1024)
        controller.abort(User())
        outcome = await task
    assert outcome.ended_by == "interrupt"
    assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
    assert outcome.output_bytes < 8 * GIB
