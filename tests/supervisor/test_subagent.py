"""The subagent tool: a child agent with its own log, sharing the parent's workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from andon.base import User
from andon.llm import Scripted
from andon.session import SubagentEvent, check, load, read
from andon.supervisor import subagent_tool
from tests.supervisor.support import (
    CHILD_SLOW,
    DELEGATE,
    Watcher,
    agent_for,
    assert_sound,
    records,
    turn_ends,
)
from tests.support import REPO, session_leftovers, wait_all_exited
from tests.workers.pytools import registry


def tools_with_child(child_replies: list[dict[str, object]]) -> object:
    reg = registry()
    reg.add(subagent_tool(lambda: Scripted(list(child_replies))))
    return reg


async def test_a_subagent_reports_back(tmp_path: Path) -> None:
    child = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "echo 42"}}]},
        {"text": "The answer is 42."},
    ]
    replies = [DELEGATE, {"text": "The subagent found 42."}]
    async with agent_for(tmp_path, replies, tools=tools_with_child(child)) as agent:  # type: ignore[arg-type]
        agent.followup("delegate it")
        await agent.when_idle()
    result = next(r["data"] for r in records(tmp_path) if r["type"] == "tool/result")
    assert result["is_error"] is False
    assert result["content"].startswith("The answer is 42.")
    child_dir = tmp_path / "subagents" / "c1-1-1"
    assert_sound(child_dir)
    assert_sound(tmp_path)
    assert "tool/started" not in [r["type"] for r in records(tmp_path)]


async def test_cancelling_the_parent_stops_the_child_and_its_tool(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [DELEGATE], tools=tools_with_child(CHILD_SLOW)) as agent:  # type: ignore[arg-type]
        watcher = Watcher(agent)
        agent.followup("delegate it")
        await watcher.wait(
            lambda r: isinstance(r, SubagentEvent) and r.event.type == "tool/started"
        )
        agent.cancel(User())
        await agent.when_idle()
        await watcher.close()
    child_dir = tmp_path / "subagents" / "c1-1-1"
    assert turn_ends(child_dir) == [{"kind": "aborted", "reason": {"kind": "parent"}}]
    assert turn_ends(tmp_path) == [{"kind": "aborted", "reason": {"kind": "user"}}]
    result = next(r["data"] for r in records(tmp_path) if r["type"] == "tool/result")
    assert "the subagent was aborted by parent agent" in result["content"]
    assert result["error"]["code"] == "ABORTED"
    assert session_leftovers(child_dir, "c1-1-1") == []
    assert_sound(child_dir)
    assert_sound(tmp_path)


def test_a_crash_mid_subagent_repairs_both_logs(tmp_path: Path) -> None:
    folder = tmp_path / "parent"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.supervisor.subagent_driver", str(folder)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    child_dir = folder / "subagents" / "c1-1-1"
    tool_pid = next(r.data.pid for r in read(child_dir) if r.type == "tool/started")  # type: ignore[union-attr]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert wait_all_exited([tool_pid], timeout=2.0) == []
    loaded = load(folder)
    assert check(loaded.events) == []
    child = read(child_dir)
    assert check(child) == []
    assert [r.data.reason.kind for r in child if r.type == "turn/end"] == ["interrupted"]  # type: ignore[union-attr]
    parent_result = next(r.data for r in loaded.events if r.type == "tool/result")
    assert parent_result.error.code == "TOOL_OUTCOME_UNKNOWN"  # type: ignore[union-attr]


async def test_what_a_subagent_spent_is_added_to_the_parent_s_usage(tmp_path: Path) -> None:
    """The session's totals (run/summary, cost) include its children's tokens."""
    spent = {
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "prompt_cache_hit_tokens": 64,
        "prompt_cache_miss_tokens": 36,
    }
    child = [{"text": "The answer is 42.", "usage": spent}]
    replies = [{**DELEGATE, "usage": spent}, {"text": "Found 42.", "usage": spent}]
    async with agent_for(tmp_path, replies, tools=tools_with_child(child)) as agent:  # type: ignore[arg-type]
        agent.followup("delegate it")
        await agent.when_idle()
        usage = dict(agent.usage)
    # two replies of the parent's and one of the child's
    assert usage["prompt_tokens"] == 300 and usage["completion_tokens"] == 30
    assert usage["cached_prompt_tokens"] == 192 and usage["uncached_prompt_tokens"] == 108
