"""The grace timeline against real process trees, in every containment mode."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from andon import procs
from andon.base import ErrorCode, GracePolicy, ManualClock, User, executor_id
from andon.testing import (
    SHELL_SLEEP,
    STUBBORN,
    TRAP_INT,
    benchmark_tree,
    leader_obeys_member_stubborn,
)
from tests.support import call_entry
from tests.workers.support import MODES, bash, call_processes, running_pool, start


@pytest.mark.parametrize("mode", MODES)
async def test_sleep_dies_on_sigint(mode: str) -> None:
    clock = ManualClock()
    async with running_pool(mode, clock=clock) as (_, executor):
        task, rec, controller = await start(executor, bash("c1-1-1", SHELL_SLEEP))
        await rec.wait_output()
        controller.abort(User())
        outcome = await task
    assert outcome.ended_by == "interrupt"
    assert outcome.exit_signal == signal.SIGINT
    assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
    assert rec.stages == ["interrupt"]
    assert "[stopped: aborted by user; SIGINT at +0.00s" in outcome.content
    assert outcome.content.startswith("ready\n")
    assert call_processes(executor, "c1-1-1") == []


@pytest.mark.parametrize("mode", MODES)
async def test_group_trapping_sigint_ends_on_sigterm(mode: str) -> None:
    clock = ManualClock()
    grace = GracePolicy(term_after=2.0, kill_after=3.0)
    async with running_pool(mode, clock=clock, grace=grace) as (_, executor):
        task, rec, controller = await start(executor, bash("c1-1-1", TRAP_INT))
        await rec.wait_output()
        controller.abort(User())
        await rec.wait_stage("interrupt")
        assert not task.done()
        clock.advance(2.0)  # term_after on the executor's clock
        outcome = await task
    assert outcome.ended_by == "term"
    assert outcome.exit_signal == signal.SIGTERM
    assert rec.stages[:2] == ["interrupt", "term"]
    assert "SIGTERM at +2.00s" in outcome.content


@pytest.mark.parametrize("mode", MODES)
async def test_group_ignoring_int_and_term_is_killed(mode: str) -> None:
    clock = ManualClock()
    grace = GracePolicy(term_after=2.0, kill_after=3.0)
    async with running_pool(mode, clock=clock, grace=grace) as (_, executor):
        task, rec, controller = await start(executor, bash("c1-1-1", STUBBORN))
        await rec.wait_output()
        controller.abort(User())
        await rec.wait_stage("interrupt")
        clock.advance(2.0)
        await rec.wait_stage("term")
        assert not task.done()
        clock.advance(3.0)
        outcome = await task
    assert outcome.ended_by == "kill"
    assert outcome.exit_signal == signal.SIGKILL
    assert [s for s in rec.stages if s in ("interrupt", "term", "kill")] == [
        "interrupt",
        "term",
        "kill",
    ]
    assert call_processes(executor, "c1-1-1") == []


@pytest.mark.parametrize("mode", MODES)
async def test_sweep_kills_a_member_that_outlives_its_leader(mode: str) -> None:
    # Real time here: the sweep's SIGTERM -> SIGKILL delay is the worker's (kill_after = 0.2 s).
    grace = GracePolicy(term_after=30.0, kill_after=0.2)
    async with running_pool(mode, grace=grace) as (_, executor):
        task, rec, controller = await start(
            executor, bash("c1-1-1", leader_obeys_member_stubborn())
        )
        await rec.wait_output()
        controller.abort(User())
        outcome = await task
    assert outcome.ended_by == "interrupt"
    assert "sweep-term" in rec.stages and "sweep-kill" in rec.stages
    assert outcome.strays_killed >= 1
    assert "background process" in outcome.content
    assert call_processes(executor, "c1-1-1") == []


@pytest.mark.parametrize("mode", MODES)
async def test_force_skips_the_grace_period(mode: str) -> None:
    clock = ManualClock()
    grace = GracePolicy(term_after=100.0, kill_after=100.0)
    async with running_pool(mode, clock=clock, grace=grace) as (_, executor):
        task, rec, controller = await start(executor, bash("c1-1-1", STUBBORN))
        await rec.wait_output()
        controller.abort(User())
        await rec.wait_stage("interrupt")
        executor.force()  # no clock movement at all
        outcome = await task
    assert outcome.ended_by == "kill"
    assert "term" in rec.stages and "kill" in rec.stages


@pytest.mark.parametrize("mode", MODES)
async def test_timeout_gives_tool_timeout_with_partial_output(mode: str) -> None:
    clock = ManualClock()
    async with running_pool(mode, clock=clock) as (_, executor):
        task, rec, _ = await start(
            executor,
            bash("c1-1-1", "echo partial-1; echo partial-2; echo ready; sleep 1000", timeout=5),
        )
        await rec.wait_output()
        clock.advance(5.0)
        outcome = await task
    assert outcome.error is not None and outcome.error.code is ErrorCode.TOOL_TIMEOUT
    assert outcome.ended_by == "timeout-interrupt"
    assert "partial-1\npartial-2" in outcome.content
    assert "[timed out after 5s;" in outcome.content


@pytest.mark.parametrize("mode", MODES)
async def test_background_job_of_a_successful_call_is_killed(mode: str) -> None:
    async with running_pool(mode) as (_, executor):
        task, rec, _ = await start(executor, bash("c1-1-1", "sleep 1000 & echo done"))
        outcome = await task
    assert outcome.exit_code == 0 and not outcome.is_error
    assert outcome.ended_by == "exit"
    assert outcome.strays_killed == 1
    assert "[andon stopped 1 background process this command left running]" in outcome.content
    assert "sweep-term" in rec.stages
    assert call_processes(executor, "c1-1-1") == []


@pytest.mark.parametrize("mode", MODES)
async def test_failed_build_is_never_reported_as_success(mode: str) -> None:
    async with running_pool(mode) as (_, executor):
        results = []
        for n, code in enumerate((2, 0, 1, 77), start=1):
            task, _, _ = await start(executor, bash(f"c1-1-{n}", f"echo build; exit {code}"))
            results.append(await task)
    assert [r.exit_code for r in results] == [2, 0, 1, 77]
    assert [r.is_error for r in results] == [True, False, True, True]
    assert results[0].content.endswith("[exit code 2]")


def _kill_tagged(owner: str, call_id: str) -> None:
    procs.signal_tagged(call_entry(owner, call_id), signal.SIGKILL, wait=5.0)


@pytest.mark.parametrize("mode", MODES)
async def test_benchmark_tree_stops_fast_and_the_daemon_stops_writing(
    mode: str, tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks"
    # term_after=10: if the stop took the grace path it would take 10 s; the leader obeys SIGINT
    # and the sweep takes the rest at once.
    grace = GracePolicy(term_after=10.0, kill_after=10.0)
    owner = executor_id()
    try:
        async with running_pool(mode, grace=grace, identity=owner) as (_, executor):
            task, rec, controller = await start(
                executor, bash("c1-1-1", benchmark_tree(str(ticks)))
            )
            await rec.wait_output()
            loop = asyncio.get_running_loop()
            t = loop.time()
            controller.abort(User())
            outcome = await task
            elapsed = loop.time() - t
        assert outcome.ended_by == "interrupt"
        assert elapsed < 5.0  # generous; far below term_after (the benchmark measures it)
        # In pgroup mode the escapee and the daemon left the group: their tag still names them.
        assert outcome.unreachable == 0
        assert outcome.strays_killed >= 45
        assert call_processes(executor, "c1-1-1") == []
        size = ticks.stat().st_size
        await asyncio.sleep(0.1)  # sleep-ok: proving an absence (the file no longer grows)
        assert ticks.stat().st_size == size
    finally:
        _kill_tagged(owner, "c1-1-1")


async def test_a_tree_stop_reports_every_stage_with_targets() -> None:
    async with running_pool("subreaper") as (_, executor):
        task, rec, controller = await start(
            executor, bash("c1-1-1", leader_obeys_member_stubborn())
        )
        await rec.wait_output()
        controller.abort(User())
        await task
    for stage, at, targets in rec.signals:
        assert at >= 0
        assert targets >= 1, stage
