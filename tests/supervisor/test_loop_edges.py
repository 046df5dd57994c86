"""The edges of the loop that broke under review: disposal with a queue, a steer that lands while
``turn/end`` is being made durable, hooks that raise, hooks for calls that never ran, the retry
hook, model failures reported live, and ``max_parallel`` checked."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from andon.base import ConfigError, ModelError, User
from andon.llm import Scripted
from andon.session import SessionLog, fold_state, read
from andon.supervisor import (
    Agent,
    Allow,
    Deny,
    GiveUp,
    OnRequestError,
    PostTool,
    PreTool,
    Retry,
    ToolCallInfo,
    TurnStopping,
)
from andon.supervisor._outcome import ToolOutcome
from tests.supervisor.support import Watcher, agent_for, agent_on, assert_sound, records, turn_ends


def entered(folder: Path) -> list[str]:
    return [r["data"]["message"]["content"] for r in records(folder) if r["type"] == "user/message"]


def results(folder: Path) -> list[dict[str, Any]]:
    return [r["data"] for r in records(folder) if r["type"] == "tool/result"]


BLOCKING = {
    "tool_calls": [{"name": "bash", "arguments": {"command": "echo ready; exec sleep 1000"}}]
}


async def test_disposal_clears_the_queue_durably(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [BLOCKING]) as agent:
        watcher = Watcher(agent)
        agent.followup("first")
        await watcher.wait_output("ready")
        agent.followup("tail")  # queued behind the running turn
        await watcher.close()
    # Leaving the block is cancel(Disposed()): the queued follow-up is discarded on record.
    splices = [r["data"] for r in records(tmp_path) if r["type"] == "agent/inbox/spliced"]
    assert splices[-1]["outcome"] == "canceled"
    assert fold_state(read(tmp_path)).next_turn == ()
    async with agent_for(tmp_path, [{"text": "answered"}]) as agent:
        agent.followup("new question")
        await agent.when_idle()
    assert entered(tmp_path) == ["first", "new question"]
    assert_sound(tmp_path)


class GatedSync:
    """An fsync seam that, once armed, holds the next sync until the test releases it: the moment
    between ``turn/end`` written and ``turn/end`` durable, made to last."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.armed = False
        self.holding = asyncio.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        if self.armed:
            self.armed = False
            self.loop.call_soon_threadsafe(self.holding.set)
            self.release.wait(timeout=60)
        os.fsync(fd)


async def test_a_steer_during_the_turn_end_barrier_runs(tmp_path: Path) -> None:
    gate = GatedSync(asyncio.get_running_loop())

    async def arm(turn: int, *, signal: Any) -> None:
        # The next sync after the turn-stopping hooks is the one that makes turn/end durable.
        gate.armed = turn == 1

    log = SessionLog.open(tmp_path, fsync=gate)
    model = Scripted([{"text": "one"}, {"text": "two"}])
    try:
        async with agent_on(log, model, tmp_path, hooks=[TurnStopping(arm)]) as agent:
            agent.followup("first")
            await gate.holding.wait()  # turn/end 1 is written, not yet durable
            assert records(tmp_path)[-1]["type"] == "turn/end"
            agent.steer("more")
            gate.release.set()
            await agent.when_idle()
            await agent.aclose()
    finally:
        gate.release.set()
        await log.aclose()
    assert entered(tmp_path) == ["first", "more"]
    assert turn_ends(tmp_path) == [{"kind": "completed"}, {"kind": "completed"}]
    assert_sound(tmp_path)


async def test_a_steer_in_the_turn_end_barrier_runs_through_open_agent(tmp_path: Path) -> None:
    box: list[Agent] = []
    steered: list[str] = []

    def steer() -> None:
        steered.append(box[0].steer("more"))

    async def schedule(turn: int, *, signal: Any) -> None:
        # This hook returns without suspending; the driver then writes turn/end in the same
        # synchronous section and awaits the barrier that makes it durable: the first moment the
        # loop runs a callback scheduled here is inside that barrier.
        if turn == 1:
            asyncio.get_running_loop().call_soon(steer)

    replies = [{"text": "one"}, {"text": "two"}]
    async with agent_for(tmp_path, replies, hooks=[TurnStopping(schedule)]) as agent:
        box.append(agent)
        agent.followup("first")
        await agent.when_idle()
        assert steered
    assert entered(tmp_path) == ["first", "more"]
    assert turn_ends(tmp_path) == [{"kind": "completed"}, {"kind": "completed"}]
    assert_sound(tmp_path)


TWO_CALLS = {
    "tool_calls": [
        {"name": "bash", "arguments": {"command": "echo one"}},
        {"name": "bash", "arguments": {"command": "echo two"}},
    ]
}


async def test_a_raising_post_tool_hook_gives_each_call_one_result(tmp_path: Path) -> None:
    seen: list[str] = []

    async def post(call: ToolCallInfo, result: ToolOutcome, *, signal: Any) -> None:
        seen.append(call.call_id)
        raise RuntimeError("the audit sink is down")

    async with agent_for(tmp_path, [TWO_CALLS], hooks=[PostTool(post)]) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await agent.when_idle()
        error = await watcher.wait_error()
        await watcher.close()
    assert "audit sink is down" in error.message
    ids = [r["call_id"] for r in results(tmp_path)]
    assert ids == ["c1-1-1", "c1-1-2"]  # one result each: none written twice
    assert seen == ["c1-1-1"]  # the hook failed the turn: no hook after the failure
    (end,) = turn_ends(tmp_path)
    assert end["kind"] == "error" and "audit sink is down" in end["error"]["message"]
    assert_sound(tmp_path)


async def test_post_tool_runs_once_per_executed_call_and_never_for_one_that_never_ran(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str, str | None]] = []
    agent_box: list[Agent] = []

    async def pre(call: ToolCallInfo, *, signal: Any) -> Allow | Deny:
        if call.call_id == "c1-1-2":
            return Deny("not this one")
        if call.call_id == "c1-1-3":
            agent_box[0].cancel(User())  # the rest of the step never runs
        return Allow()

    async def post(call: ToolCallInfo, result: ToolOutcome, *, signal: Any) -> None:
        seen.append((call.call_id, str(result.code) if result.code else None))

    calls = {
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "echo ran"}},
            {"name": "bash", "arguments": {"command": "echo denied"}},
            {"name": "bash", "arguments": {"command": "echo cancelled-before-dispatch"}},
            {"name": "bash", "arguments": {"command": "echo never-started"}},
        ]
    }
    async with agent_for(
        tmp_path, [calls], hooks=[PreTool(pre), PostTool(post)], workers=1
    ) as agent:
        agent_box.append(agent)
        agent.followup("go")
        await agent.when_idle()
    codes = [(r["call_id"], r.get("error", {}).get("code")) for r in results(tmp_path)]
    assert codes == [
        ("c1-1-1", None),
        ("c1-1-2", "DENIED"),
        ("c1-1-3", "ABORTED_BEFORE_DISPATCH"),
        ("c1-1-4", "ABORTED_BEFORE_DISPATCH"),
    ]
    assert seen == [("c1-1-1", None)]
    assert_sound(tmp_path)


async def test_on_request_error_replaces_the_retry_decision(tmp_path: Path) -> None:
    asked: list[tuple[str, int]] = []

    async def decide(error: ModelError, attempt: int, *, signal: Any) -> Retry | GiveUp:
        asked.append((error.code.value, attempt))
        return Retry(0.0) if error.code.value == "BAD_REQUEST" else GiveUp()

    # BAD_REQUEST is final for the adapter's own policy; the hook retries it once, then gives up.
    replies: list[dict[str, Any]] = [
        {"error": {"code": "BAD_REQUEST", "message": "first refusal"}},
        {"text": "second attempt answered"},
        {"error": {"code": "SERVER", "message": "down"}},
    ]
    async with agent_for(tmp_path, replies, hooks=[OnRequestError(decide)]) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await agent.when_idle()
        agent.followup("two")
        await agent.when_idle()
        error = await watcher.wait_error()
        await watcher.close()
    assert asked == [("BAD_REQUEST", 1), ("SERVER", 1)]
    kinds = [r["type"] for r in records(tmp_path) if r["type"].startswith("llm/")]
    assert kinds == ["llm/request", "llm/retry", "llm/request", "llm/request"]
    ends = turn_ends(tmp_path)
    assert ends[0] == {"kind": "completed"}
    assert ends[1]["kind"] == "error" and ends[1]["error"]["code"] == "SERVER"
    assert error.code == "SERVER"  # a model failure is reported live too
    assert_sound(tmp_path)


async def test_a_hook_that_returns_nonsense_fails_the_turn_clearly(tmp_path: Path) -> None:
    async def decide(error: ModelError, attempt: int, *, signal: Any) -> Any:
        return "yes please"

    replies = [{"error": {"code": "SERVER"}}]
    async with agent_for(tmp_path, replies, hooks=[OnRequestError(decide)]) as agent:
        agent.followup("one")
        await agent.when_idle()
    (end,) = turn_ends(tmp_path)
    assert end["kind"] == "error" and "Retry(delay) or GiveUp()" in end["error"]["message"]


async def test_a_model_failure_is_reported_as_agent_error(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [{"error": {"status": 401}}]) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await agent.when_idle()
        error = await watcher.wait_error()
        await watcher.close()
    assert error.code == "AUTH"
    assert turn_ends(tmp_path)[0]["error"]["code"] == "AUTH"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
async def test_max_parallel_is_checked_before_anything_opens(tmp_path: Path, bad: Any) -> None:
    folder = tmp_path / "s"
    with pytest.raises(ConfigError, match="max_parallel"):
        async with agent_for(folder, [], max_parallel=bad):
            pass
    assert not folder.exists()  # nothing was created, nothing is lost
