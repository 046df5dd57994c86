"""Spare call processes (docs/workers.md, Spare call processes): forked ahead while the worker is
idle, handed the call when it comes, inside the call's group and cgroup before the tool's first
line, never losing a cancel at the handover, and never outliving their worker.

The spare is found as its worker's only child once a ``bash`` call has come back: the worker forks
the spare right after sending a result, before it reads the next ``run``, and a shell call leaves
the spare alone. No sleep orders anything here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal as _signal
from pathlib import Path

import pytest

from andon import procs
from andon.base import AbortController, ErrorCode, GracePolicy, ManualClock, User
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.procs import ProcessKey
from andon.supervisor import ToolCallRequest, ToolExecutor
from tests.faulty_launcher import FaultyLauncher
from tests.faulty_workers import SigtermBeforeTheCallProcessIsReady
from tests.support import alive_after, fifo_in
from tests.workers.pytools import spare_tools
from tests.workers.support import MODES, bash, call_processes, running_pool, start

COOPERATIVE = GracePolicy(term_after=math.inf, kill_after=1.0)
TRIALS = 20


def call(call_id: str, tool_name: str, /, **arguments: object) -> ToolCallRequest:
    return ToolCallRequest(call_id, tool_name, json.dumps(arguments), os.getcwd())


def _worker_pid(pool: WorkerPool) -> int:
    (pid,) = pool.workers.values()
    return pid


async def spare_of(pool: WorkerPool, executor: ToolExecutor, call_id: str) -> ProcessKey:
    """The worker's spare: after a shell call has come back, the worker's only child."""
    outcome = await executor.execute(bash(call_id, "true"), AbortController().signal)
    assert outcome.exit_code == 0, outcome
    worker = _worker_pid(pool)
    children = [p for p in procs.snapshot() if p.ppid == worker and not p.zombie]
    assert len(children) == 1, children
    (spare,) = children
    assert spare.pgid == spare.pid  # its own group from the fork on
    return spare.key


@pytest.mark.parametrize("mode", MODES)
async def test_a_python_call_is_handed_to_the_spare_forked_before_it(mode: str) -> None:
    async with running_pool(mode, registry=spare_tools()) as (pool, executor):
        for n in range(3):
            spare = await spare_of(pool, executor, f"c1-{n + 1}-1")
            task, rec, _ = await start(executor, call(f"c1-{n + 1}-2", "where_am_i"))
            outcome = await task
            assert outcome.error is None, outcome.content
            seen = json.loads(outcome.content)
            assert rec.started is not None
            # The call ran in the spare, and the worker said so with the spare's identity.
            assert seen["pid"] == spare.pid == rec.started.pid == rec.started.pgid
            key = ProcessKey.from_create_time(rec.started.pid, rec.started.create_time)
            assert key.start == spare.start
            assert seen["pgid"] == spare.pid
            assert seen["call_id"] == f"c1-{n + 1}-2"
            if mode == "cgroup":
                assert rec.started.cgroup is not None
                assert "0::" + _relative(rec.started.cgroup) in seen["cgroup"].splitlines()
            if mode == "pgroup":
                # The only way pgroup mode finds an escapee is this tag: it must be there.
                assert seen["tagged"] is True
            # A fresh spare follows each call.
            assert (await spare_of(pool, executor, f"c1-{n + 1}-3")) != spare


def _relative(cgroup: str) -> str:
    """A cgroup's path as ``/proc/self/cgroup`` shows it (below the cgroup2 mount)."""
    for root, _writable in procs.cgroup2_mounts():
        if Path(cgroup).is_relative_to(root):
            return "/" + str(Path(cgroup).relative_to(root))
    raise AssertionError(f"{cgroup} is under no cgroup2 mount")


async def test_a_call_too_big_to_hand_over_runs_in_its_own_fork() -> None:
    async with running_pool("subreaper", registry=spare_tools()) as (pool, executor):
        # Arguments that fit the pipe are handed over...
        spare = await spare_of(pool, executor, "c1-1-1")
        fits = {"data": {"text": "x" * (32 * 1024)}}
        request = ToolCallRequest("c1-1-2", "takes_data", json.dumps(fits), os.getcwd())
        task, rec, _ = await start(executor, request)
        outcome = await task
        assert outcome.error is None and outcome.content == "1", outcome.content[:200]
        assert rec.started is not None and rec.started.pid == spare.pid
        # ... more than it holds are not: the call gets its own fork.
        spare = await spare_of(pool, executor, "c1-1-3")
        seen = _info(spare)
        too_big = {"data": {"text": "x" * (2 * 1024 * 1024)}}
        request = ToolCallRequest("c1-1-4", "takes_data", json.dumps(too_big), os.getcwd())
        task, rec, _ = await start(executor, request)
        outcome = await task
        assert outcome.error is None and outcome.content == "1", outcome.content[:200]
        assert rec.started is not None and rec.started.pid != spare.pid
        # The spare it could not use was let go of, and another took its place.
        assert alive_after([seen], timeout=5.0) == []
        assert (await spare_of(pool, executor, "c1-1-5")) != spare


async def test_a_spare_that_died_is_not_handed_a_call() -> None:
    async with running_pool("subreaper", registry=spare_tools()) as (pool, executor):
        spare = await spare_of(pool, executor, "c1-1-1")
        seen = _info(spare)
        assert procs.signal_key(spare, _signal.SIGKILL)
        assert alive_after([seen], timeout=5.0) == []
        task, rec, _ = await start(executor, call("c1-1-2", "where_am_i"))
        outcome = await task
        assert outcome.error is None, outcome.content
        assert rec.started is not None and rec.started.pid != spare.pid
        assert json.loads(outcome.content)["pid"] == rec.started.pid


def _info(key: ProcessKey) -> procs.ProcInfo:
    info = procs.stat(key.pid)
    assert info is not None and info.key == key
    return info


async def test_a_cancel_to_a_call_process_whose_pipe_is_broken_leaves_the_worker_standing(
    tmp_path: Path,
) -> None:
    """The worker's SIGPIPE is at its default action (what its tools inherit): a cancel written
    to a call process that no longer reads its pipe must not end the worker."""
    fifo = fifo_in(tmp_path)
    clock = ManualClock()
    grace = GracePolicy(term_after=1.0, kill_after=1.0)
    async with running_pool("subreaper", registry=spare_tools(), clock=clock, grace=grace) as (
        pool,
        executor,
    ):
        before = dict(pool.workers)
        task, rec, controller = await start(
            executor, call("c1-1-1", "closes_its_pipes", ready=str(fifo))
        )
        assert await asyncio.to_thread(fifo.read_text) == "closed\n"
        controller.abort(User())
        await rec.wait_stage("interrupt")
        assert rec.signals[0][2] == 0  # written to nobody
        clock.advance(1.0)  # SIGTERM ends it
        outcome = await task
        assert outcome.ended_by == "term"
        assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
        assert dict(pool.workers) == before  # the worker never died


@pytest.mark.parametrize("mode", MODES)
async def test_an_unused_spare_ends_with_its_worker(mode: str) -> None:
    async with running_pool(mode, registry=spare_tools()) as (pool, executor):
        spare = _info(await spare_of(pool, executor, "c1-1-1"))
        worker = procs.stat(_worker_pid(pool))
        assert worker is not None
        # Killed without a word: the spare reads the end of its pipe and exits.
        assert procs.signal_key(worker.key, _signal.SIGKILL)
        assert alive_after([spare], timeout=5.0) == []
    async with running_pool(mode, registry=spare_tools()) as (pool, executor):
        spare = _info(await spare_of(pool, executor, "c1-1-1"))
    # Stopped by its pool: the worker ended its spare before it went.
    assert alive_after([spare], timeout=5.0) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tool_name", ["marks_then_cooperates", "marks_then_cooperates_sync"])
async def test_a_cancel_around_the_handover_is_never_lost(tool_name: str, tmp_path: Path) -> None:
    """The spare is stopped (SIGSTOP) before its call, so a handover waits unread in its pipe.
    Each trial picks when the cancel lands: a number of event-loop turns after the call began
    (0 to 4 for the first early trials, then seeded; before the worker has the ``run``, before
    the handover, after it), the spare let go
    on at once; or once the worker has said ``started``, the spare let go on only after the worker
    has written the interrupt behind the call it has not read. Whatever the order, the call ends
    by its interrupt or never starts, nothing outlives it, and an interrupt written behind the
    unread handover stops the tool before its first line."""
    rng = random.Random(tool_name)
    ended: dict[str, int] = {}
    behind_seen = 0
    async with running_pool("subreaper", registry=spare_tools(), grace=COOPERATIVE) as (
        pool,
        executor,
    ):
        workers = dict(pool.workers)
        most = 40
        early = [0, 1, 2, 3, 4]
        for n in range(TRIALS):
            spare = await spare_of(pool, executor, f"c2-{n + 1}-1")
            assert procs.signal_key(spare, _signal.SIGSTOP)
            marker = tmp_path / f"ran-{n}"
            behind = rng.random() < 0.5
            # The first trials that abort early walk the boundary one turn at a time from 0, so
            # the side where the abort wins (0 turns: before ``execute`` even runs) is always
            # tried, however fast a loaded machine makes the dispatch; the rest are seeded.
            turns = early.pop(0) if early and not behind else rng.randrange(0, most)
            controller = AbortController()
            task, rec, _ = await start(
                executor,
                call(f"c2-{n + 1}-2", tool_name, marker=str(marker)),
                controller.signal,
            )
            if behind:
                behind_seen += 1
                await rec.wait_until(lambda r=rec: r.started is not None)  # handed over, unread
                controller.abort(User())
                await rec.wait_stage("interrupt")  # written behind the call
                assert not marker.exists()
            else:
                for _ in range(turns):
                    await asyncio.sleep(0)  # sleep-ok: one event-loop turn each, an ordering
                controller.abort(User())
            # Resumed either way: a spare never handed this call stays for the next one.
            assert procs.signal_key(spare, _signal.SIGCONT)
            outcome = await asyncio.wait_for(task, 30)
            where = f"trial {n} ({turns} turns, behind={behind}): {outcome.content!r}"
            assert outcome.error is not None, where
            assert outcome.error.code in (ErrorCode.ABORTED, ErrorCode.ABORTED_BEFORE_DISPATCH)
            assert outcome.ended_by in ("interrupt", "not-run"), where
            assert "term" not in rec.stages and "kill" not in rec.stages, where
            if behind:
                assert outcome.ended_by == "interrupt", where
                assert not marker.exists(), where  # stopped before the tool's first line
            elif outcome.ended_by == "not-run" and "interrupt" not in ended:
                most = min(most * 2, 1 << 16)  # every abort came too early yet: widen the range
            ended[outcome.ended_by] = ended.get(outcome.ended_by, 0) + 1
        assert dict(pool.workers) == workers  # no worker was lost or replaced
        for n in range(TRIALS):
            assert call_processes(executor, f"c2-{n + 1}-2") == []
    assert ended.get("not-run", 0) > 0 and ended.get("interrupt", 0) > 0, ended
    assert behind_seen > 0


async def test_a_stage_before_a_call_process_is_ready_acts_on_it_not_on_the_worker() -> None:
    # Each call process (and spare) gets SIGTERM before it drops the worker's handlers. Held
    # blocked until then, it ends the call process by its default action; delivered at once,
    # the worker's handler in the child would catch it and tell the worker (through the wakeup
    # pipe they share) to drain: the worker would go, and the tool run on.
    launcher = FaultyLauncher([SigtermBeforeTheCallProcessIsReady])
    async with WorkerPool(WorkerPoolConfig(size=1), spare_tools(), launcher=launcher) as pool:
        worker = dict(pool.workers)
        executor = ToolExecutor(pool, pool.registry)
        for n in (1, 2):
            task, _, _ = await start(executor, call(f"c1-1-{n}", "where_am_i"))
            outcome = await asyncio.wait_for(task, 30)
            assert outcome.exit_signal == _signal.SIGTERM, outcome.content
        assert dict(pool.workers) == worker  # the same worker served both: it never drained
