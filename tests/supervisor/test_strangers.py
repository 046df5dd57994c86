"""Two sessions sharing one worker pool: each stops only its own calls (the same call ids in both).

One session's cancel, and its disposal, must leave the other session's tool running to its own
end; the other's tool waits on a gate the test opens only after the damage is done.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import andon
from andon.base import GracePolicy, User
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.llm import Scripted
from andon.session import AgentEvent, ToolOutput
from tests.supervisor.support import Watcher, records, turn_ends
from tests.support import fifo_in, gated, open_gate, session_leftovers
from tests.workers.pytools import registry as make_registry
from tests.workers.support import MODES


def bash(command: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def is_ready(item: AgentEvent) -> bool:
    return isinstance(item, ToolOutput) and "ready" in item.text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["cancel", "close"])
async def test_stopping_one_session_leaves_the_other_sessions_call_running(
    mode: str, how: str, tmp_path: Path
) -> None:
    fifo = fifo_in(tmp_path)
    registry = make_registry()
    grace = GracePolicy(term_after=0.5, kill_after=0.5)
    config = WorkerPoolConfig(size=2, containment=mode)  # type: ignore[arg-type]
    async with WorkerPool(config, registry) as pool:
        theirs_model = Scripted([bash(gated(fifo)), {"text": "Done."}])
        async with andon.open_agent(
            tmp_path / "theirs", model=theirs_model, tools=registry, workers=pool, grace=grace
        ) as theirs:
            their_events = Watcher(theirs)
            theirs.followup("wait for the gate")
            await their_events.wait(is_ready)
            mine_model = Scripted([bash("echo ready; exec sleep 1000"), {"text": "Stopped."}])
            async with andon.open_agent(
                tmp_path / "mine", model=mine_model, tools=registry, workers=pool, grace=grace
            ) as mine:
                my_events = Watcher(mine)
                mine.followup("run")
                await my_events.wait(is_ready)
                if how == "cancel":
                    mine.cancel(User())
                    await mine.when_idle()
                await my_events.close()
            # Mine is stopped (cancelled, or disposed with the block) and nothing of it is left.
            assert session_leftovers(tmp_path / "mine", "c1-1-1") == []
            assert theirs.status == "running"
            await open_gate(fifo)
            await theirs.when_idle()
            await their_events.close()
    (result,) = [r["data"] for r in records(tmp_path / "theirs") if r["type"] == "tool/result"]
    assert result["exit"] == {"code": 0, "signal": None}
    assert "finished normally" in result["content"]
    assert turn_ends(tmp_path / "theirs") == [{"kind": "completed"}]
    assert os.path.exists(tmp_path / "mine" / "events.jsonl")
