"""Closing a worker pool answers every call it holds, and leaves nothing running.

Several sessions may share one pool (``open_agent(..., workers=pool)``), so a pool can close
under calls that are running in its workers, and under calls still waiting for a worker: each gets
an answer saying the pool was closed, none waits forever, and no process of theirs outlives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import andon
from andon.base import AbortController, ErrorCode, GracePolicy, NoWorkerStarted, WorkerError
from andon.fleet import (
    ForkserverLauncher,
    LaunchedWorker,
    PoolSetup,
    WorkerPool,
    WorkerPoolConfig,
    WorkerSpec,
    _forkserver,
)
from andon.fleet._pool_state import Phase
from andon.llm import Scripted
from andon.supervisor import ToolCallRequest, ToolExecutor, ToolOutcome
from tests.supervisor.support import Watcher, records
from tests.support import session_leftovers
from tests.workers.pytools import more_tools
from tests.workers.support import MODES, bash, call_processes, start

CALLS = {
    "python": ("cooperative", {"seconds": 1000}),
    "python-deaf": ("stubborn_sync", {"seconds": 1000}),
    "shell": ("bash", {"command": "echo ready; exec sleep 1000"}),
}


def _request(kind: str, call_id: str = "c1-1-1") -> ToolCallRequest:
    name, arguments = CALLS[kind]
    return ToolCallRequest(call_id, name, json.dumps(arguments), os.getcwd())


def _pool(mode: str = "subreaper", **config: Any) -> WorkerPool:
    return WorkerPool(WorkerPoolConfig(size=1, containment=mode, **config), more_tools())  # type: ignore[arg-type]


def _closed(outcome: ToolOutcome) -> None:
    """The answer of a call its pool's close ended."""
    assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST
    assert outcome.is_error
    assert "the worker pool was closed" in outcome.error.message
    assert outcome.content.endswith(
        "Error: worker lost: the worker pool was closed; andon killed the call's processes"
    )
    assert outcome.ended_by == "worker-lost"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["python", "python-deaf", "shell"])
async def test_closing_the_pool_answers_a_running_call(mode: str, kind: str) -> None:
    pool = _pool(mode)
    await pool.start()
    try:
        executor = ToolExecutor(pool, pool.registry)
        task, rec, _ = await start(executor, _request(kind))
        await rec.wait_until(lambda: rec.started is not None)
    finally:
        await pool.aclose()
    outcome = await asyncio.wait_for(task, 30)
    _closed(outcome)
    assert outcome.started is not None
    assert call_processes(executor, "c1-1-1") == []


async def test_calls_waiting_for_a_worker_and_calls_after_the_close_get_an_error() -> None:
    async with _pool() as pool:
        executor = ToolExecutor(pool, pool.registry)
        running, rec, _ = await start(executor, _request("python"))
        await rec.wait_until(lambda: rec.started is not None)
        # The one worker is busy: this call waits for it (without a task of its own).
        waiting, _, _ = await start(executor, _request("shell", "c1-1-2"))
        await asyncio.sleep(0)  # sleep-ok: one loop turn, so the waiting call is in acquire
        await pool.aclose()
        for outcome in (
            await asyncio.wait_for(waiting, 30),
            await asyncio.wait_for(
                executor.execute(_request("shell", "c1-1-3"), AbortController().signal), 30
            ),
        ):
            assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST
            assert outcome.ended_by == "not-run" and not outcome.ran
            assert outcome.content == "Error: no worker to run the call: the worker pool was closed"
        _closed(await asyncio.wait_for(running, 30))
        assert call_processes(executor, "c1-1-1") == []


async def test_a_worker_that_does_not_answer_the_close_is_killed_and_its_call_answered() -> None:
    pool = _pool(stop_timeout=0.2)
    await pool.start()
    try:
        executor = ToolExecutor(pool, pool.registry)
        task, rec, _ = await start(executor, _request("shell"))
        await rec.wait_output()
        (worker,) = pool.workers.values()
        # A wedged worker (stopped, swapped out): it never reads the shutdown, never reports.
        os.kill(worker, signal.SIGSTOP)
    finally:
        await pool.aclose()  # SIGKILLs its group after stop_timeout
    outcome = await asyncio.wait_for(task, 30)
    _closed(outcome)
    assert outcome.content.startswith("ready\n")
    assert call_processes(executor, "c1-1-1") == []


async def test_waiting_for_a_worker_starts_no_task() -> None:
    async with _pool() as pool:
        lease = await pool.acquire()
        tasks = asyncio.all_tasks()
        waiter = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)  # sleep-ok: one loop turn, so the waiter is in acquire
        assert asyncio.all_tasks() == {*tasks, waiter}
        lease.release()
        second = await asyncio.wait_for(waiter, 30)
        assert second.worker_id == lease.worker_id
        second.release()


async def test_a_shared_pool_closing_under_sessions_answers_each_of_them(tmp_path: Path) -> None:
    tools = more_tools()
    pool = WorkerPool(WorkerPoolConfig(size=1, containment="subreaper"), tools)
    await pool.start()
    folders = [tmp_path / "a", tmp_path / "b"]
    calls: list[dict[str, Any]] = [
        {"name": "cooperative", "arguments": {"seconds": 1000}},
        {"name": "bash", "arguments": {"command": "echo ready; exec sleep 1000"}},
    ]
    try:
        async with (
            andon.open_agent(
                folders[0],
                model=Scripted([{"tool_calls": [calls[0]]}, {"text": "a done"}]),
                tools=tools,
                workers=pool,
                grace=GracePolicy(term_after=1.0, kill_after=1.0),
            ) as first,
            andon.open_agent(
                folders[1],
                model=Scripted([{"tool_calls": [calls[1]]}, {"text": "b done"}]),
                tools=tools,
                workers=pool,
                grace=GracePolicy(term_after=1.0, kill_after=1.0),
            ) as second,
        ):
            watchers = [Watcher(first), Watcher(second)]
            first.followup("go")
            await watchers[0].wait_type("tool/started")
            second.followup("go")  # its call waits for the pool's one worker
            await watchers[1].wait_type("tool/call")
            await pool.aclose()
            await asyncio.wait_for(first.when_idle(), 30)
            await asyncio.wait_for(second.when_idle(), 30)
            for watcher in watchers:
                await watcher.close()
    finally:
        await pool.aclose()
    for folder, ended_by in zip(folders, ["worker-lost", "not-run"], strict=True):
        (result,) = [r["data"] for r in records(folder) if r["type"] == "tool/result"]
        assert result["error"]["code"] == "WORKER_LOST"
        assert "the worker pool was closed" in result["content"]
        assert result["ended_by"] == ended_by
        assert [r["data"]["reason"] for r in records(folder) if r["type"] == "turn/end"]
        assert session_leftovers(folder, "c1-1-1") == []


async def test_a_pool_started_in_one_task_works_and_closes_from_another() -> None:
    # The pool's task group is entered by whoever starts the pool: here a task that is over
    # long before the pool is used, replaces a worker, and is closed by another task.
    pool = _pool()
    await asyncio.create_task(pool.start())
    try:
        executor = ToolExecutor(pool, pool.registry)
        lost = await executor.execute(
            ToolCallRequest("c1-1-1", "kills_its_worker", "{}", os.getcwd()),
            AbortController().signal,
        )
        assert lost.error is not None and lost.error.code is ErrorCode.WORKER_LOST
        after = await asyncio.wait_for(
            executor.execute(bash("c1-1-2", "echo after"), AbortController().signal), 30
        )
        assert after.content == "after\n[exit code 0]"  # on the replacement worker
    finally:
        await asyncio.create_task(pool.aclose())
    assert pool.workers == {}


def _alive(pid: int | None) -> bool:
    """Whether ``pid`` (our own child, if anything) still runs; a reaped one is gone."""
    from andon import procs

    return pid is not None and procs.child_running(pid)


async def test_the_close_ends_idle_workers_and_the_helpers_it_started_and_reaps_them() -> None:
    """A fast close (docs/workers.md, Starting workers): idle workers are SIGKILLed rather than
    asked to exit, and the forkserver the pool started is killed and reaped; nothing of them
    outlives the close, not even a zombie."""
    from andon import procs

    pool = WorkerPool(WorkerPoolConfig(size=2), more_tools())
    await pool.start()
    await pool.wait_started()  # start() returns with one worker ready; both are wanted here
    infos = [procs.stat(pid) for pid in pool.workers.values()]
    workers = [procs.Pidfd.open(info.key) for info in infos if info is not None]
    assert len(workers) == 2
    server = _forkserver._forkserver_pid()
    assert _alive(server)
    await pool.aclose()
    assert server is not None and not _alive(server)
    with pytest.raises(ChildProcessError):  # reaped, not left as zombies
        os.waitid(os.P_PID, server, os.WEXITED | os.WNOHANG)  # noqa: ASYNC222 (WNOHANG)
    for fd in workers:
        assert fd is not None and fd.exited()
        fd.close()


async def test_the_forkserver_is_the_only_helper_a_pool_starts() -> None:
    """No resource tracker or other helper process: while a pool is open, the only child it
    gave this process is the forkserver (the workers are its children). Children this test
    process had before (another test's, under xdist) are not the pool's."""
    from andon import procs

    def children() -> set[int]:
        return {p.pid for p in procs.snapshot() if p.ppid == os.getpid()}

    before = children()
    async with WorkerPool(WorkerPoolConfig(size=2), more_tools()) as pool:
        await pool.wait_started()
        server = _forkserver._forkserver_pid()
        assert server is not None and children() - before == {server}
        for pid in pool.workers.values():
            info = procs.stat(pid)
            assert info is not None and info.ppid == server


@pytest.mark.timeout(180)
async def test_a_close_while_workers_still_start_leaves_none_of_them() -> None:
    """start() returns once one worker is ready and the rest start in the background: a close at
    that moment cancels starts whose thread may still fork a worker (it waits on the forkserver).
    What such a start forked is killed, and the close waits for it (the suite's leftover check
    is the assertion: a forked worker would outlive the close, watching a supervisor that lives
    on)."""
    for _ in range(15):
        async with WorkerPool(WorkerPoolConfig(size=4), more_tools()):
            pass


class _StopsSeen(ForkserverLauncher):
    """Local workers; ``stopping`` is set once the pool's close waits for a worker to stop."""

    def __init__(self) -> None:
        super().__init__("subreaper")
        self.stopping = asyncio.Event()
        self.started: list[LaunchedWorker] = []

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        launched = await super().start(spec)
        self.started.append(launched)
        return launched

    async def stop(self, worker: LaunchedWorker, timeout: float) -> None:
        self.stopping.set()
        await super().stop(worker, timeout)


async def test_a_close_cut_short_by_a_stop_still_ends_the_workers_and_answers_the_call() -> None:
    """A stop (the closing task cancelled) that lands while the close waits for a busy worker,
    here a wedged one that would keep it waiting its whole ``stop_timeout``, cuts that wait short
    and nothing after it (docs/workers.md, The pool's life): the worker is killed, its call is
    answered, and the close's later steps still run (the launcher's close ends the forkserver)."""
    launcher = _StopsSeen()
    pool = WorkerPool(WorkerPoolConfig(size=1, stop_timeout=600), more_tools(), launcher=launcher)
    await pool.start()
    executor = ToolExecutor(pool, pool.registry)
    task, rec, _ = await start(executor, _request("shell"))
    await rec.wait_output()
    (worker,) = pool.workers.values()
    server = _forkserver._forkserver_pid()
    assert _alive(server)
    os.kill(worker, signal.SIGSTOP)  # it never reads the shutdown, never reports
    closing = asyncio.create_task(pool.aclose())
    await asyncio.wait_for(launcher.stopping.wait(), 30)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    _closed(await asyncio.wait_for(task, 30))
    assert call_processes(executor, "c1-1-1") == []
    assert [w.has_exited() for w in launcher.started] == [True]
    assert not _alive(server)
    with pytest.raises(WorkerError, match="the worker pool was closed"):
        await pool.acquire()


class _HeldOpen(ForkserverLauncher):
    """Local workers whose launcher's open() is held until the test lets it go on."""

    def __init__(self) -> None:
        super().__init__("subreaper")
        self.opening = asyncio.Event()
        self.go_on = asyncio.Event()
        self.closed = False

    async def open(self, setup: PoolSetup) -> None:
        self.opening.set()
        await self.go_on.wait()
        await super().open(setup)

    async def aclose(self) -> None:
        self.closed = True
        await super().aclose()


async def test_a_close_from_another_task_while_the_pool_starts_ends_the_start() -> None:
    """A close that lands while start() opens things (here, its launcher) ends the start with an
    answer, and what the start opened after the close began is closed too."""
    launcher = _HeldOpen()
    pool = WorkerPool(WorkerPoolConfig(size=1), more_tools(), launcher=launcher)
    starting = asyncio.create_task(pool.start())
    await asyncio.wait_for(launcher.opening.wait(), 30)
    await pool.aclose()
    launcher.go_on.set()
    with pytest.raises(NoWorkerStarted, match="the worker pool was closed"):
        await asyncio.wait_for(starting, 30)
    assert launcher.closed
    assert pool.workers == {}


async def test_a_stop_while_the_close_waits_for_the_pools_tasks_is_not_lost() -> None:
    """A cancel that lands while the close waits for the pool's own tasks to end (a task group
    that is ending already does not raise it) still reaches the closing task: the close runs to
    its end, then raises it."""
    pool = _pool()
    await pool.start()
    ending, go_on = asyncio.Event(), asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ending.set()
            await go_on.wait()
            raise

    pool._spawn_task(slow_to_end)
    closing = asyncio.create_task(pool.aclose())
    await asyncio.wait_for(ending.wait(), 30)  # the group ends: the close waits for this task
    closing.cancel()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(closing, 30)
    assert pool._state.phase is Phase.CLOSED
    assert pool.workers == {}
