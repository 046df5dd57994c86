"""Turns, steps and the inbox (docs/agent-loop.md), against real workers and a real log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from andon.base import AgentClosed, Disposed, Parent, User
from andon.session import AgentStatus, read
from andon.supervisor import Enter, Reject
from tests.supervisor.support import (
    Watcher,
    agent_for,
    assert_sound,
    kinds,
    parked_session,
    records,
    turn_ends,
)

CANONICAL_TEXT = [
    "session/start",
    "agent/inbox/spliced",
    "turn/start",
    "agent/inbox/spliced",
    "step/start",
    "user/message",
    "llm/request",
    "assistant/message",
    "step/end",
    "turn/end",
]


async def test_idle_followup_logs_turn_start_and_claim_before_returning(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [{"text": "Hello there."}]) as agent:
        agent.followup("hi")
        assert agent.status == "running"
        assert kinds(tmp_path) == CANONICAL_TEXT[:4]  # synchronously: insert, turn/start, claim
        await agent.when_idle()
    assert kinds(tmp_path) == CANONICAL_TEXT
    assert "assistant/chunk" in kinds(tmp_path, chunks=True)
    assert turn_ends(tmp_path) == [{"kind": "completed"}]
    assert_sound(tmp_path)


async def test_three_followups_in_one_tick_are_three_turns(tmp_path: Path) -> None:
    replies = [{"text": "one"}, {"text": "two"}, {"text": "three"}]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("a")
        agent.followup("b")
        agent.followup("c")
        await agent.when_idle()
        await watcher.wait(lambda r: r == AgentStatus("idle"))
        statuses = [r.status for r in watcher.live(AgentStatus)]
        await watcher.close()
    recs = records(tmp_path)
    users = [r["data"]["message"]["content"] for r in recs if r["type"] == "user/message"]
    assert users == ["a", "b", "c"]
    assert [r["data"]["turn"] for r in recs if r["type"] == "turn/start"] == [1, 2, 3]
    assert [
        len([1 for r in recs if r["type"] == "user/message" and r["data"]["turn"] == t])
        for t in (1, 2, 3)
    ] == [1, 1, 1]
    assert statuses == ["running", "idle"]  # one pair for the three turns
    assert_sound(tmp_path)


async def test_steer_enters_the_next_step_of_the_same_turn(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "working", "tool_calls": [{"name": "cooperative", "arguments": {"seconds": 0.3}}]},
        {"text": "done with the steer"},
    ]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("start")
        await watcher.wait_type("tool/started")
        agent.steer("also check the tests")
        await agent.when_idle()
        await watcher.close()
    recs = records(tmp_path)
    entered = [
        (r["data"]["turn"], r["data"]["step"], r["data"]["message"]["source"])
        for r in recs
        if r["type"] == "user/message"
    ]
    assert entered == [(1, 1, "user"), (1, 2, "steer")]
    assert turn_ends(tmp_path) == [{"kind": "completed"}]
    assert_sound(tmp_path)


async def test_inject_while_idle_wakes_nothing_and_enters_with_the_next_followup(
    tmp_path: Path,
) -> None:
    async with agent_for(tmp_path, [{"text": "ok"}]) as agent:
        agent.inject("context: it is Tuesday")
        assert agent.status == "idle"
        assert "turn/start" not in kinds(tmp_path)
        agent.followup("what day is it?")
        await agent.when_idle()
    sources = [
        r["data"]["message"]["source"] for r in records(tmp_path) if r["type"] == "user/message"
    ]
    assert sources == ["inject", "user"]
    assert_sound(tmp_path)


async def test_a_steer_from_a_turn_stopping_hook_runs_as_another_step(tmp_path: Path) -> None:
    from andon.supervisor import TurnStopping

    steered: list[int] = []
    box: dict[str, Any] = {}

    async def stopping(turn: int, *, signal: object) -> None:
        if not steered:
            steered.append(turn)
            box["agent"].steer("one more thing")

    replies = [{"text": "first"}, {"text": "second"}]
    async with agent_for(tmp_path, replies, hooks=[TurnStopping(stopping)]) as agent:
        box["agent"] = agent
        agent.followup("go")
        await agent.when_idle()
    steps = [r["data"]["step"] for r in records(tmp_path) if r["type"] == "step/start"]
    assert steps == [1, 2]
    assert turn_ends(tmp_path) == [{"kind": "completed"}]
    assert_sound(tmp_path)


async def test_first_cause_wins(tmp_path: Path) -> None:
    replies = [
        {"text": "thinking", "stall_after_chunks": 1},
        {"text": "x", "stall_after_chunks": 1},
    ]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await watcher.wait_type("assistant/chunk")
        agent.cancel(Parent())
        agent.cancel(User())
        await agent.when_idle()
        agent.followup("two")
        await watcher.wait_type("assistant/chunk", turn=2)
        agent.cancel(User())
        await watcher.close()
    # the second turn is then disposed: its first cause (user) stays
    assert turn_ends(tmp_path) == [
        {"kind": "aborted", "reason": {"kind": "parent"}},
        {"kind": "aborted", "reason": {"kind": "user"}},
    ]
    assert_sound(tmp_path)


async def test_idle_cancel_clears_queued_context_and_arms_nothing(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [{"text": "fresh"}]) as agent:
        agent.inject("stale context")
        agent.cancel(User())
        recs = records(tmp_path)
        assert recs[-1]["type"] == "agent/inbox/spliced"
        assert recs[-1]["data"]["outcome"] == "canceled"
        agent.followup("new question")  # nothing armed: this runs normally
        await agent.when_idle()
    assert turn_ends(tmp_path) == [{"kind": "completed"}]
    sources = [
        r["data"]["message"]["content"] for r in records(tmp_path) if r["type"] == "user/message"
    ]
    assert sources == ["new question"]


async def test_keep_inbox_cancel_parks_followups_until_the_next_waking_send(
    tmp_path: Path,
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "a", "stall_after_chunks": 1},
        {"text": "parked ran"},
        {"text": "latest"},
    ]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("first")
        await watcher.wait_type("assistant/chunk")
        agent.followup("queued before the cancel")
        agent.cancel(User(), keep_inbox=True)
        await agent.when_idle()
        assert agent.status == "idle"
        assert "canceled" not in str(records(tmp_path))
        assert len(turn_ends(tmp_path)) == 1  # parked: nothing ran after the aborted turn
        agent.followup("wake")
        await agent.when_idle()
        await watcher.close()
    users = [
        r["data"]["message"]["content"] for r in records(tmp_path) if r["type"] == "user/message"
    ]
    assert users == ["first", "queued before the cancel", "wake"]
    assert_sound(tmp_path)


async def test_sends_after_dispose_raise_agent_closed(tmp_path: Path) -> None:
    async with agent_for(tmp_path, []) as agent:
        pass
    before = (tmp_path / "events.jsonl").read_bytes()
    with pytest.raises(AgentClosed):
        agent.followup("too late")
    assert (tmp_path / "events.jsonl").read_bytes() == before


async def test_max_tokens_is_sticky_and_length_tool_calls_never_run(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [
        {
            "text": "cut off",
            "finish": "length",
            "tool_calls": [{"name": "bash", "arguments": {"command": "touch SHOULD_NOT_EXIST"}}],
        },
        {"text": "now", "tool_calls": [{"name": "bash", "arguments": {"command": "echo ran"}}]},
        {"text": "finished"},
    ]
    from andon.supervisor import TurnStopping

    box: dict[str, Any] = {}

    async def steer_once(turn: int, *, signal: object) -> None:
        if "done" not in box:
            box["done"] = True
            box["agent"].steer("continue")  # forces step 2 after the max-tokens step 1

    hooks = [TurnStopping(steer_once)]
    async with agent_for(tmp_path / "s", replies, cwd=tmp_path, hooks=hooks) as agent:
        box["agent"] = agent
        agent.followup("go")
        await agent.when_idle()
    folder = tmp_path / "s"
    assert not (tmp_path / "SHOULD_NOT_EXIST").exists()
    msgs = [r["data"] for r in records(folder) if r["type"] == "assistant/message"]
    assert msgs[0]["finish"] == "length" and msgs[0]["dropped_tool_calls"] == 1
    assert msgs[1]["finish"] == "tool_calls"
    assert [r["data"]["step"] for r in records(folder) if r["type"] == "step/start"] == [1, 2, 3]
    assert turn_ends(folder) == [{"kind": "max-tokens"}]
    assert_sound(folder)


async def test_pre_step_reject_blocks_the_turn(tmp_path: Path) -> None:
    from andon.supervisor import PreStep

    async def gate(messages: object, turn: int, step: int, *, signal: object) -> Reject | Enter:
        return Reject("policy: no deploys on Friday")

    async with agent_for(tmp_path, [], hooks=[PreStep(gate)]) as agent:
        agent.followup("deploy")
        await agent.when_idle()
    assert turn_ends(tmp_path) == [{"kind": "blocked", "by": "policy: no deploys on Friday"}]
    assert "step/start" not in kinds(tmp_path)
    assert_sound(tmp_path)


async def test_denied_and_invalid_calls_are_results_and_the_turn_goes_on(tmp_path: Path) -> None:
    from andon.supervisor import Allow, Deny, PreTool

    async def policy(call: Any, *, signal: object) -> Allow | Deny:
        return Deny("no network") if "curl" in call.arguments else Allow()

    replies: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "curl example.com"}},
                {"name": "bash", "arguments": {"comand": "typo"}},
                {"name": "no_such_tool", "arguments": {}},
            ]
        },
        {"text": "handled"},
    ]
    async with agent_for(tmp_path, replies, hooks=[PreTool(policy)]) as agent:
        agent.followup("go")
        await agent.when_idle()
    results = [r["data"] for r in records(tmp_path) if r["type"] == "tool/result"]
    assert [r["error"]["code"] for r in results] == ["DENIED", "INVALID_ARGUMENTS", "UNKNOWN_TOOL"]
    assert "no network" in results[0]["content"]
    assert "'comand'" in results[1]["content"] or "'command'" in results[1]["content"]
    assert turn_ends(tmp_path) == [{"kind": "completed"}]
    assert_sound(tmp_path)


async def test_a_disposed_turn_never_latches(tmp_path: Path) -> None:
    replies = [{"text": "slow", "stall_after_chunks": 1}]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await watcher.wait_type("assistant/chunk")
        agent.cancel(Disposed(), keep_inbox=True)
        agent.followup("after dispose cause")  # waking after a Disposed abort: parked, not latched
        await agent.when_idle()
        await watcher.close()
        assert len(turn_ends(tmp_path)) == 1
    assert turn_ends(tmp_path) == [{"kind": "aborted", "reason": {"kind": "disposed"}}]
    log = read(tmp_path)
    assert log[-1].type in ("turn/end", "agent/inbox/spliced")


async def test_wake_runs_parked_work_of_a_resumed_session(tmp_path: Path) -> None:
    async with agent_for(tmp_path, []) as agent:
        agent.inject("context parked while idle")
        assert agent.wake() is True  # queued work: a turn starts
        await agent.when_idle()
    async with agent_for(tmp_path, [{"text": "ran the parked work"}]) as agent:
        assert agent.wake() is False  # nothing queued any more
    async with agent_for(tmp_path / "disposed", []) as agent:
        agent.inject("dropped")  # disposal clears the inbox durably: a resume never runs it
    async with agent_for(tmp_path / "disposed", []) as agent:
        assert agent.wake() is False
    parked_session(tmp_path / "second", next_step=["parked"])  # as a crashed process leaves it
    async with agent_for(tmp_path / "second", [{"text": "picked up after resume"}]) as agent:
        assert agent.status == "idle"  # pending work waits for a waking send...
        assert agent.wake() is True  # ...or an explicit wake
        await agent.when_idle()
    entered = [
        r["data"]["message"]["content"]
        for r in records(tmp_path / "second")
        if r["type"] == "user/message"
    ]
    assert entered == ["parked"]
    assert turn_ends(tmp_path / "second") == [{"kind": "completed"}]
