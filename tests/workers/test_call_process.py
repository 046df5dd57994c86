"""Python tools run in call processes: their children's statuses are their own, nothing they leave
outlives the call, and their signal aborts with the real cause."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from andon import procs
from andon.base import AbortController, ErrorCode, GracePolicy, Hook, ManualClock, User
from andon.supervisor import ToolCallRequest
from tests.support import alive_after, fifo_in
from tests.workers.pytools import more_tools
from tests.workers.support import MODES, call_processes, running_pool, start

TRIALS = 50


def call(call_id: str, tool_name: str, /, **arguments: object) -> ToolCallRequest:
    return ToolCallRequest(call_id, tool_name, json.dumps(arguments), os.getcwd())


@pytest.mark.parametrize("mode", MODES)
async def test_a_python_tools_children_exit_statuses_are_its_own(mode: str) -> None:
    async with running_pool(mode, registry=more_tools()) as (_, executor):
        signal = AbortController().signal
        seen = []
        for n in range(TRIALS):
            outcome = await executor.execute(call(f"c1-1-{n + 1}", "exit_statuses"), signal)
            seen.append(outcome.content)
    # subprocess.run (plain and capture_output) and an asyncio subprocess, each exiting 3.
    assert seen == ["3,3,3"] * TRIALS


def _gone(started: object) -> bool:
    from andon.protocol import Started

    assert isinstance(started, Started)
    key = procs.ProcessKey.from_create_time(started.pid, started.create_time)
    info = procs.stat(started.pid)
    return info is None or info.key != key or not alive_after([info], timeout=5.0)


@pytest.mark.parametrize("mode", MODES)
async def test_nothing_a_returning_python_tool_leaves_outlives_its_result(mode: str) -> None:
    async with running_pool(mode, registry=more_tools()) as (_, executor):
        task, rec, _ = await start(executor, call("c1-1-1", "leaves_things", mode="return"))
        outcome = await task
        assert outcome.content.startswith("left"), outcome.content
        # The setsid child (the only process of it that could outlive the call process) was
        # swept; the thread and the task ended with the call process.
        assert outcome.strays_killed == 1
        assert call_processes(executor, "c1-1-1") == []
        assert rec.started is not None and _gone(rec.started)


@pytest.mark.parametrize("mode", MODES)
async def test_nothing_a_cancelled_python_tool_leaves_outlives_its_result(mode: str) -> None:
    async with running_pool(mode, registry=more_tools()) as (_, executor):
        task, rec, controller = await start(
            executor, call("c1-1-1", "leaves_things", mode="cooperate")
        )
        await rec.wait_until(lambda: rec.started is not None)
        controller.abort(User())
        outcome = await task
        assert outcome.ended_by == "interrupt"
        assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
        assert call_processes(executor, "c1-1-1") == []
        assert rec.started is not None and _gone(rec.started)


@pytest.mark.parametrize("mode", MODES)
async def test_a_python_tool_ignoring_everything_is_killed_and_its_worker_stays(
    mode: str, tmp_path: Path
) -> None:
    fifo = fifo_in(tmp_path)
    clock = ManualClock()
    grace = GracePolicy(term_after=1.0, kill_after=1.0)
    async with running_pool(mode, registry=more_tools(), clock=clock, grace=grace) as (
        pool,
        executor,
    ):
        before = dict(pool.workers)
        task, rec, controller = await start(
            executor, call("c1-1-1", "leaves_things", mode="ignore", ready=str(fifo))
        )
        assert await asyncio.to_thread(fifo.read_text) == "deaf\n"
        controller.abort(User())
        await rec.wait_stage("interrupt")
        clock.advance(1.0)  # SIGTERM, which the tool ignores
        await rec.wait_stage("term")
        clock.advance(1.0)  # SIGKILL to the call's group
        outcome = await task
        assert outcome.ended_by == "kill"
        assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
        assert call_processes(executor, "c1-1-1") == []
        assert rec.started is not None and _gone(rec.started)
        assert dict(pool.workers) == before  # never signalled, never replaced


@pytest.mark.parametrize("mode", MODES)
async def test_a_python_tool_sees_the_real_cause_and_the_result_names_it_once(
    mode: str, tmp_path: Path
) -> None:
    probe = tmp_path / "reason"
    fifo = fifo_in(tmp_path)
    async with running_pool(mode, registry=more_tools()) as (_, executor):
        task, _, controller = await start(
            executor, call("c1-1-1", "reason_probe", path=str(probe), ready=str(fifo))
        )
        # Once the tool runs: a cancel before that means it never starts (tested elsewhere).
        assert await asyncio.to_thread(fifo.read_text) == "running\n"
        controller.abort(Hook("turn budget exceeded"))
        outcome = await task
    assert probe.read_text() == "by hook: turn budget exceeded"
    assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
    assert outcome.content.count("turn budget exceeded") == 1, outcome.content
    assert "by user" not in outcome.content


async def test_a_python_tool_timeout_is_its_signals_reason(tmp_path: Path) -> None:
    probe = tmp_path / "reason"
    registry = more_tools()
    tool = registry.get("reason_probe")
    assert tool is not None
    clock = ManualClock()
    async with running_pool("subreaper", registry=registry, clock=clock) as (_, executor):
        executor.default_timeout = 5.0
        fifo = fifo_in(tmp_path)
        task, _, _ = await start(
            executor, call("c1-1-1", "reason_probe", path=str(probe), ready=str(fifo))
        )
        assert await asyncio.to_thread(fifo.read_text) == "running\n"
        clock.advance(5.0)
        outcome = await task
    assert probe.read_text() == "tool call timed out after 5s"
    assert outcome.error is not None and outcome.error.code is ErrorCode.TOOL_TIMEOUT
    assert outcome.ended_by == "timeout-interrupt"


def _writable_cgroup2_root() -> Path | None:
    for root, writable in procs.cgroup2_mounts():
        if writable:
            return root
    return None


@pytest.mark.skipif(_writable_cgroup2_root() is None, reason="no writable cgroup v2 here")
@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_that_leaves_its_cgroup_and_double_forks_is_stopped_with_the_call(
    mode: str,
) -> None:
    root = _writable_cgroup2_root()
    assert root is not None
    # What nsjail, systemd-run or bazel's sandbox do: the tool writes itself into another
    # cgroup (here the root one), then leaves a daemon behind and exits.
    command = f"echo $$ > {root}/cgroup.procs && ( setsid sleep 300 & ) ; echo moved"
    async with running_pool(mode, registry=more_tools()) as (_, executor):
        outcome = await executor.execute(
            ToolCallRequest("c1-1-1", "bash", json.dumps({"command": command}), os.getcwd()),
            AbortController().signal,
        )
        assert outcome.content.startswith("moved"), outcome.content
        assert outcome.strays_killed >= 1
        assert call_processes(executor, "c1-1-1") == []
