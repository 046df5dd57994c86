"""Turn budgets and maintenance jobs (docs/agent-loop.md, Hooks and Maintenance)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from andon.base import AbortSignal, ManualClock
from andon.supervisor import TurnBudget
from tests.supervisor.support import Watcher, agent_for, assert_sound, records, turn_ends
from tests.support import fifo_in
from tests.workers.pytools import more_tools

LONG_TOOL = {
    "tool_calls": [{"name": "bash", "arguments": {"command": "echo ready; exec sleep 1000"}}]
}


async def test_a_time_budget_stops_a_long_tool_and_the_next_turn_runs(tmp_path: Path) -> None:
    clock = ManualClock()
    replies: list[dict[str, Any]] = [LONG_TOOL, {"text": "next turn is fine"}]
    async with agent_for(tmp_path, replies, hooks=[TurnBudget(seconds=30)], clock=clock) as agent:
        watcher = Watcher(agent)
        agent.followup("build")
        await watcher.wait_output("ready")
        clock.advance(30)
        await agent.when_idle()
        agent.followup("again")
        await agent.when_idle()
        await watcher.close()
    assert turn_ends(tmp_path) == [
        {"kind": "aborted", "reason": {"kind": "hook", "reason": "turn budget exceeded: 30s"}},
        {"kind": "completed"},
    ]
    result = next(r["data"] for r in records(tmp_path) if r["type"] == "tool/result")
    assert result["error"]["code"] == "ABORTED"
    assert "aborted by hook: turn budget exceeded" in result["content"]
    assert_sound(tmp_path)


async def test_a_stale_budget_never_touches_a_later_turn(tmp_path: Path) -> None:
    clock = ManualClock()
    replies: list[dict[str, Any]] = [{"text": "quick"}, LONG_TOOL]
    async with agent_for(tmp_path, replies, hooks=[TurnBudget(seconds=5)], clock=clock) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await agent.when_idle()
        clock.advance(4.9)  # turn 1's budget would fire at +5
        agent.followup("two")
        await watcher.wait_output("ready")
        clock.advance(0.2)  # past turn 1's deadline, well before turn 2's
        await asyncio.sleep(0.05)  # sleep-ok: proving an absence (no cancel fires)
        assert agent.status == "running"
        clock.advance(5)
        await agent.when_idle()
        await watcher.close()
    assert turn_ends(tmp_path)[1]["reason"] == {
        "kind": "hook",
        "reason": "turn budget exceeded: 5s",
    }


async def test_a_step_budget_stops_the_turn_before_the_extra_step(tmp_path: Path) -> None:
    tool = {"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}
    async with agent_for(tmp_path, [tool, tool, tool], hooks=[TurnBudget(steps=2)]) as agent:
        agent.followup("loop")
        await agent.when_idle()
    steps = [r["data"]["step"] for r in records(tmp_path) if r["type"] == "step/start"]
    assert steps == [1, 2]
    reason = turn_ends(tmp_path)[0]
    assert reason["kind"] == "aborted" and "more than 2 steps" in reason["reason"]["reason"]
    assert_sound(tmp_path)


async def test_maintenance_latches_wakes_and_stays_idle(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [{"text": "after the job"}]) as agent:
        started, release = asyncio.Event(), asyncio.Event()

        async def job(signal: AbortSignal) -> None:
            started.set()
            await release.wait()

        task = asyncio.create_task(agent.run_maintenance(job))
        await started.wait()
        assert agent.status == "idle"
        agent.followup("queued during the job")
        assert "turn/start" not in [r["type"] for r in records(tmp_path)]
        with pytest.raises(RuntimeError, match="idle"):
            await agent.run_maintenance(job)
        release.set()
        await task
        await agent.when_idle()
    assert turn_ends(tmp_path) == [{"kind": "completed"}]


async def test_run_maintenance_while_running_raises(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [{"text": "x", "stall_after_chunks": 1}]) as agent:
        agent.followup("go")

        async def job(signal: AbortSignal) -> None:
            raise AssertionError("must not run")

        with pytest.raises(RuntimeError, match="idle"):
            await agent.run_maintenance(job)


async def test_a_python_tool_stopped_by_a_budget_sees_the_hook_and_the_model_reads_it_once(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    probe, gate = tmp_path / "reason", fifo_in(tmp_path)
    call = {"name": "reason_probe", "arguments": {"path": str(probe), "ready": str(gate)}}
    replies = [{"tool_calls": [call]}]
    async with agent_for(
        tmp_path / "s", replies, tools=more_tools(), hooks=[TurnBudget(seconds=30)], clock=clock
    ) as agent:
        agent.followup("probe")
        assert await asyncio.to_thread(gate.read_text) == "running\n"  # the tool runs
        clock.advance(30)
        await agent.when_idle()
    assert probe.read_text() == "by hook: turn budget exceeded: 30s"
    result = next(r["data"] for r in records(tmp_path / "s") if r["type"] == "tool/result")
    assert result["error"]["code"] == "ABORTED"
    assert result["content"].count("turn budget exceeded") == 1, result["content"]
    assert "by user" not in result["content"]
    assert_sound(tmp_path / "s")
