"""Stops during compaction (docs/agent-loop.md, Compaction, Stops): a cancel or a kill -9 at any
moment of the summary call leaves no ``context/compacted`` record and a log that checks, and the
session then completes from there."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from andon.base import User
from andon.llm import OpenAICompatible, from_spec
from andon.session import check, history, load, read
from andon.testing import MockModelServer
from tests.supervisor.support import (
    SummaryTripwire,
    agent_for,
    assert_sound,
    assert_valid_request,
    chatty_job,
    records,
)
from tests.support import REPO

WINDOW = 3000
STEPS = 8
SUMMARY = "Summary: eight steps, each said the build step went through; nothing failed. " * 6
CHUNKS = -(-len(SUMMARY) // 16)  # the mock streams 16 characters a chunk
# 20 moments, seeded: before the summary's first chunk, between any two, after its last.
MOMENTS = sorted(random.Random(36).sample(range(CHUNKS + 1), 20))


def _types(folder: Path) -> list[str]:
    return [r["type"] for r in records(folder)]


async def _finish(folder: Path, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resume the session and run ``replies`` to the end; the requests the server answered."""
    async with MockModelServer(replies, context_window=WINDOW, summaries=SUMMARY) as server:
        model = from_spec(f"{server.base_url}#mock")
        assert isinstance(model, OpenAICompatible)
        try:
            async with agent_for(folder, model, context_window=WINDOW) as agent:
                agent.followup("go on")
                await agent.when_idle()
        finally:
            await model.aclose()
        assert server.overflows == 0
        return [r.body for r in server.requests]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("at", MOMENTS)
async def test_a_cancel_during_the_summary_writes_no_summary(tmp_path: Path, at: int) -> None:
    job = chatty_job(STEPS, 2000)
    async with MockModelServer(job, context_window=WINDOW, summaries=SUMMARY) as server:
        inner = from_spec(f"{server.base_url}#mock")
        assert isinstance(inner, OpenAICompatible)
        try:
            box: list[Any] = []
            model = SummaryTripwire(inner, at, lambda: box[0].cancel(User()))
            async with agent_for(tmp_path, model, context_window=WINDOW) as agent:
                box.append(agent)
                agent.followup("go")
                await agent.when_idle()
        finally:
            await inner.aclose()
        answered = len(server.requests)
    assert model.fired
    log = records(tmp_path)
    ends = [r["data"]["reason"] for r in log if r["type"] == "turn/end"]
    assert ends == [{"kind": "aborted", "reason": {"kind": "user"}}]
    assert "context/compacted" not in _types(tmp_path)
    assert_sound(tmp_path)
    # The turn is resumed in a new one and completes, compacting first.
    steps_done = sum(1 for r in log if r["type"] == "assistant/message")
    bodies = await _finish(tmp_path, [*job[steps_done:]])
    assert answered > 0 and bodies
    assert "context/compacted" in _types(tmp_path)
    assert_sound(tmp_path)
    assert [r["data"]["reason"]["kind"] for r in records(tmp_path) if r["type"] == "turn/end"][
        -1
    ] == "completed"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("at", MOMENTS)
def test_kill_9_at_seeded_moments_of_the_summary_then_repair_check_and_resume(
    tmp_path: Path, at: int
) -> None:
    # One moment a test (not all twenty in one): each is two andon processes' worth of work, and
    # on a loaded runner twenty in a row outgrow any one bound.
    import asyncio

    job = chatty_job(STEPS, 2000)
    folder = tmp_path / "s"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.supervisor.compaction_driver", str(folder), str(at)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, (at, proc.returncode, proc.stderr[-2000:])
    loaded = load(folder)
    assert check(loaded.events) == []
    assert "context/compacted" not in [r.type for r in loaded.events]
    assert_valid_request(history(loaded.events))
    steps_done = sum(1 for r in loaded.events if r.type == "assistant/message")
    asyncio.run(_finish(folder, [*job[steps_done:]]))
    assert check(read(folder)) == []
    assert_sound(folder)
    ends = [r["data"]["reason"]["kind"] for r in records(folder) if r["type"] == "turn/end"]
    assert ends == ["interrupted", "completed"], (at, ends)
