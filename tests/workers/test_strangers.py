"""Nothing that is not a call's own is ever touched: calls with the same call id in two sessions
sharing a pool, in two pools of one process, and a stranger that took over a reaped leader's pid.

Each "stranger" is a real tool call (or process) that must run to its own end while its neighbour
is cancelled, swept or closed. A gate (a fifo it reads) holds it until the test has done the
damage it checks for, so nothing here waits on time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from andon import procs
from andon.base import ErrorCode, GracePolicy, User, call_tag, executor_id
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolExecutor
from andon.testing import SHELL_SLEEP
from andon.workers import default
from tests.support import (
    call_entry,
    can_force_pids,
    fifo_in,
    gated,
    leftovers,
    open_gate,
    spawn_at_pid,
)
from tests.workers.support import MODES, bash, running_pool, start


def assert_ran_to_its_end(outcome: object) -> None:
    assert getattr(outcome, "ended_by", None) == "exit", outcome
    assert getattr(outcome, "exit_code", None) == 0
    assert "finished normally" in getattr(outcome, "content", "")


@pytest.mark.parametrize("mode", MODES)
async def test_two_sessions_sharing_a_pool_never_stop_each_others_calls(
    mode: str, tmp_path: Path
) -> None:
    fifo = fifo_in(tmp_path)
    registry = default()
    config = WorkerPoolConfig(size=2, containment=mode)  # type: ignore[arg-type]
    async with WorkerPool(config, registry) as pool:
        # Two sessions' executors over one pool, with the same call id.
        mine = ToolExecutor(pool, registry, grace=GracePolicy(term_after=0.5, kill_after=0.5))
        theirs = ToolExecutor(pool, registry)
        assert mine.identity != theirs.identity
        stranger, stranger_rec, _ = await start(theirs, bash("c1-1-1", gated(fifo)))
        await stranger_rec.wait_output()
        task, rec, controller = await start(mine, bash("c1-1-1", SHELL_SLEEP + " & wait"))
        await rec.wait_output()
        controller.abort(User())
        outcome = await task  # its stop and its sweep are over
        assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
        assert leftovers(call_entry(mine.identity, "c1-1-1")) == []
        assert not stranger.done()
        assert procs.tagged(call_entry(theirs.identity, "c1-1-1"))  # still running
        await open_gate(fifo)
        assert_ran_to_its_end(await stranger)
        if mode == "cgroup":
            assert stranger_rec.started is not None and rec.started is not None
            assert stranger_rec.started.cgroup != rec.started.cgroup


@pytest.mark.parametrize("mode", MODES)
async def test_closing_one_pool_leaves_another_pools_call_running(
    mode: str, tmp_path: Path
) -> None:
    fifo = fifo_in(tmp_path)
    async with running_pool(mode) as (other_pool, other):
        stranger, stranger_rec, _ = await start(other, bash("c1-1-1", gated(fifo)))
        await stranger_rec.wait_output()
        async with running_pool(mode) as (_, mine):
            task, rec, _ = await start(mine, bash("c1-1-1", "echo ready; exec sleep 1000"))
            await rec.wait_output()
        # Closing the pool stopped its own call (and its workers) ...
        outcome = await task
        assert outcome.is_error and outcome.ended_by in ("kill", "worker-lost")
        assert leftovers(call_entry(mine.identity, "c1-1-1")) == []
        # ... and nothing of the other pool's: its worker and its call are alive.
        assert not stranger.done()
        assert len(other_pool.workers) == 1
        await open_gate(fifo)
        assert_ran_to_its_end(await stranger)


# The kernel never hands out a pid that still names a process group, so a group number comes free
# only once every member has left it. Here the one that stays behind has left (setsid); pgroup
# mode cannot reach such an escapee at all (it reports it), so only the sweeping modes apply.
SWEEPING = [m for m in MODES if getattr(m, "values", (m,))[0] != "pgroup"]
ESCAPEE = (
    "{ setsid bash -c \"trap '' TERM; echo up; exec sleep 1000\" & } | head -1 >/dev/null; "
    "echo ready"
)


@pytest.mark.skipif(not can_force_pids(), reason="choosing the next pid needs root")
@pytest.mark.parametrize("mode", SWEEPING)
async def test_a_sweep_after_the_leaders_pid_was_reused_signals_no_stranger(
    mode: str, tmp_path: Path
) -> None:
    # The leader exits once its escapee is in a session of its own, and the escapee ignores
    # SIGTERM: the sweep's SIGTERM goes out, and its SIGKILL waits. In between, a stranger takes
    # the reaped leader's pid and leads a group with that number; then the stop's SIGKILL comes.
    grace = GracePolicy(term_after=60.0, kill_after=60.0)
    stranger_tag = call_tag(executor_id(), "c1-1-1")  # another owner's call of the same id
    env = {**os.environ, procs.TAG_VAR: stranger_tag}
    async with running_pool(mode, grace=grace) as (_, executor):
        request = bash("c1-1-1", ESCAPEE)
        task, rec, controller = await start(executor, request)
        await rec.wait_stage("sweep-term")
        assert rec.started is not None
        leader = rec.started.pid
        stranger = spawn_at_pid(leader, ["sleep", "1000"], env=env)
        if stranger is None:
            controller.abort(User())
            executor.force()
            await task
            pytest.skip("the machine kept taking the pid; could not force its reuse")
        try:
            info = procs.stat(stranger.pid)
            assert info is not None and info.pgid == leader  # the group number is the stranger's
            controller.abort(User())
            executor.force()
            outcome = await task  # the sweep ended: it did not wait for the stranger
            assert outcome.ended_by == "exit"
            assert leftovers(call_entry(executor.identity, "c1-1-1")) == []
            assert stranger.poll() is None  # never signalled
        finally:
            stranger.kill()  # our own unreaped child
            stranger.wait(timeout=10)
