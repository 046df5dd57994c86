"""kill -9 of a process running an agent mid-tool; load repairs; open_agent resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from andon.llm import Scripted
from andon.session import check, load
from tests.supervisor.support import agent_for, assert_valid_request, records
from tests.support import REPO, session_leftovers, wait_all_exited


async def test_kill_9_mid_tool_then_load_and_resume(tmp_path: Path) -> None:
    folder = tmp_path / "session"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.supervisor.driver", str(folder)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    started = [r["data"] for r in records(folder) if r["type"] == "tool/started"]
    tool_pid = started[0]["pid"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert wait_all_exited([tool_pid], timeout=10.0) == []
    assert session_leftovers(folder, "c1-1-1") == []

    loaded = load(folder)
    assert loaded.repaired
    assert check(loaded.events) == []
    results = {r.data.call_id: r.data for r in loaded.events if r.type == "tool/result"}  # type: ignore[union-attr]
    assert results["c1-1-1"].error.code == "TOOL_OUTCOME_UNKNOWN"  # type: ignore[union-attr]
    assert results["c1-1-1"].content.endswith("Do not retry blindly.")  # type: ignore[union-attr]
    assert results["c1-1-2"].error.code == "TOOL_NOT_STARTED"  # type: ignore[union-attr]

    model = Scripted([{"text": "I will check the deploy state before retrying."}])
    async with agent_for(folder, model) as agent:
        agent.followup("what happened?")
        await agent.when_idle()
    recs = records(folder)
    assert any(r["type"] == "session/resumed" for r in recs)
    assert [r["data"]["turn"] for r in recs if r["type"] == "turn/start"] == [1, 2]
    request = model.requests[0]
    assert_valid_request([m for m in request.messages if m["role"] != "system"])
    assert check(records(folder)) == []
