"""Starting workers: the pool is ready with one worker, a missed hello is retried with back-off,
and a pool that keeps failing gives up in bounded time (docs/workers.md, Starting workers).

Real workers (forks of the forkserver) that break their start on purpose (tests/faulty_workers.py);
the deadlines and the back-off run on a ManualClock, so no test waits for real seconds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from andon.base import ManualClock, NoWorkerStarted, WorkerError
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.fleet._launch import LaunchedWorker
from andon.fleet._pool import START_ATTEMPTS, START_BACKOFF
from andon.workers import default
from tests.faulty_launcher import FaultyLauncher
from tests.faulty_workers import ExitBeforeHello, NoHello

DEADLINE = 30.0  # on the ManualClock: never reached by real time


def _pool(
    launcher: FaultyLauncher, clock: ManualClock, size: int = 1, deadline: float = DEADLINE
) -> WorkerPool:
    config = WorkerPoolConfig(size=size, containment="subreaper", start_timeout=deadline)
    return WorkerPool(config, default(), launcher=launcher, clock=clock)


async def _until(predicate: object, what: str) -> None:
    """Wait (real time, bounded) for a condition the pool reaches on its own."""
    assert callable(predicate)
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.01)  # sleep-ok: polls a real process's hello, bounded at 20 s
    raise AssertionError(f"never: {what}")


async def _clock_or_done(clock: ManualClock, task: asyncio.Task[Any]) -> None:
    """Wait until something of the pool waits on the clock, or ``task`` is done."""
    sleepers = asyncio.ensure_future(clock.wait_for_sleepers(1))
    try:
        await asyncio.wait({sleepers, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleepers.cancel()


def _gone(worker: LaunchedWorker) -> bool:
    return worker.has_exited()


async def test_a_start_that_misses_its_hello_is_retried_after_a_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="andon.pool")
    clock = ManualClock()
    launcher = FaultyLauncher([NoHello])
    pool = _pool(launcher, clock)
    starting = asyncio.create_task(pool.start())
    try:
        await clock.wait_for_sleepers(1)  # the first worker's hello deadline
        await _until(lambda: len(launcher.started) == 1, "the first worker started")
        assert not starting.done()
        clock.advance(DEADLINE)  # it missed it: killed, and a back-off before the next try
        await _until(lambda: _gone(launcher.started[0]), "the silent worker was killed")
        await clock.wait_for_sleepers(1)
        assert len(launcher.started) == 1  # the back-off is waited out first
        clock.advance(START_BACKOFF[0])
        await asyncio.wait_for(starting, 60)
        assert len(launcher.started) == 2
        assert len(pool.workers) == 1
        lease = await pool.acquire()
        lease.release()
    finally:
        starting.cancel()
        await pool.aclose()
    assert "did not say hello within 30s" in caplog.text


async def test_start_returns_with_one_worker_and_the_rest_start_when_calls_wait() -> None:
    # The third worker would never say hello: nothing waits for it, nothing starts it unasked.
    clock = ManualClock()
    launcher = FaultyLauncher([None, None], then=NoHello)
    pool = _pool(launcher, clock, size=3)
    try:
        await asyncio.wait_for(pool.start(), 60)
        first = await pool.acquire()
        assert len(launcher.started) == 1  # a one-call job never starts the others
        waiting = asyncio.create_task(pool.acquire())  # no idle worker: one more starts for it
        second = await asyncio.wait_for(waiting, 60)
        assert len(launcher.started) == 2  # one waiting call, one start: not the whole rest
        first.release()
        second.release()
        again = await pool.acquire()  # an idle worker serves it: nothing more starts
        again.release()
        assert len(launcher.started) == 2
    finally:
        await pool.aclose()
    assert all(w.has_exited() for w in launcher.started)


async def test_wait_started_returns_once_every_worker_is_warm() -> None:
    config = WorkerPoolConfig(size=3, containment="subreaper")
    async with WorkerPool(config, default()) as pool:
        await asyncio.wait_for(pool.wait_started(), 60)
        assert len(pool.workers) == 3 and all(pool.workers.values())
        leases = [await asyncio.wait_for(pool.acquire(), 10) for _ in range(3)]
        for lease in leases:
            lease.release()


async def test_a_pool_whose_starts_all_fail_gives_up_after_bounded_attempts() -> None:
    clock = ManualClock()
    launcher = FaultyLauncher([], then=NoHello)
    pool = _pool(launcher, clock, size=2)
    starting = asyncio.create_task(pool.start())
    try:
        for _ in range(40):  # each round moves past one deadline or one back-off
            await _clock_or_done(clock, starting)
            if starting.done():
                break
            clock.advance(DEADLINE)
        with pytest.raises(NoWorkerStarted, match="no tool worker could be started"):
            await asyncio.wait_for(starting, 60)
        assert len(launcher.started) <= 2 * START_ATTEMPTS
        with pytest.raises(WorkerError, match="no tool worker could be started"):
            await pool.acquire()
    finally:
        starting.cancel()
        await pool.aclose()
    assert all(w.has_exited() for w in launcher.started)


async def test_a_waiting_call_gets_an_answer_when_replacements_keep_failing() -> None:
    # The only worker dies; every replacement exits before its hello. The call waiting for a
    # worker is answered (WorkerError: WORKER_LOST for the executor) after bounded attempts.
    clock = ManualClock()
    launcher = FaultyLauncher([None], then=ExitBeforeHello)
    pool = _pool(launcher, clock, deadline=1e9)  # only the exits and the back-offs count here
    try:
        await asyncio.wait_for(pool.start(), 60)
        lease = await pool.acquire()
        lease.kill("a test kills it")
        lease.release()
        waiting = asyncio.create_task(pool.acquire())
        for failed in range(1, START_ATTEMPTS):
            # The n-th replacement exited: the pool sleeps its back-off (the only timer then).
            await _until(lambda n=failed: pool.statistics().failed_starts == n, "a start failed")
            assert not waiting.done()
            clock.advance(max(START_BACKOFF))
        with pytest.raises(WorkerError, match="no tool worker could be started"):
            await asyncio.wait_for(waiting, 60)
        assert len(launcher.started) == 1 + START_ATTEMPTS
    finally:
        await pool.aclose()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # ipc paths are limited to ~100 bytes: a short folder, not pytest's deep one.
    path = Path(tempfile.mkdtemp(prefix="andon-t-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_deleted_runtime_folder_is_made_again_for_the_next_worker(short_dir: Path) -> None:
    config = WorkerPoolConfig(size=1, containment="subreaper", runtime_dir=str(short_dir))
    async with WorkerPool(config, default()) as pool:
        runtime = next(short_dir.iterdir())
        first = await pool.acquire()
        old_pid = first.pid
        shutil.rmtree(short_dir)
        first.kill("a test kills it")  # the replacement needs the folder and the socket
        first.release()
        lease = await asyncio.wait_for(pool.acquire(), 60)
        assert lease.pid != old_pid
        lease.release()
        info = os.stat(runtime)
        assert info.st_mode & 0o777 == 0o700 and info.st_uid == os.getuid()
        assert (runtime / "pool.sock").exists()
    assert not runtime.exists()
