"""Cancellation: salvage, stalls, draining tools, the tree, the wake latch (docs/agent-loop.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from andon.base import GracePolicy, User
from andon.llm import Scripted
from andon.session import AssistantDelta
from andon.testing import benchmark_tree
from tests.supervisor.support import Watcher, agent_for, assert_sound, kinds, records, turn_ends
from tests.support import session_leftovers

ABORTED_USER = {"kind": "aborted", "reason": {"kind": "user"}}


async def test_cancel_mid_stream_salvages_the_visible_prefix(tmp_path: Path) -> None:
    model = Scripted(
        [
            {
                "reasoning": "   ",  # whitespace only: never kept
                "text": "Let me look at the build log first. " * 20,
                "chunk_size": 8,
                "stall_after_chunks": 6,
                "tool_calls": [{"name": "bash", "arguments": {"command": "make"}}],
            },
            {"text": "resumed"},
        ]
    )
    async with agent_for(tmp_path, model) as agent:
        watcher = Watcher(agent)
        agent.followup("fix it")
        # The first visible text, live (assistant/delta): its chunk record may still be buffered.
        await watcher.wait(lambda r: isinstance(r, AssistantDelta) and r.delta["type"] == "text")
        agent.cancel(User())
        await agent.when_idle()
        agent.followup("go on")
        await agent.when_idle()
        await watcher.close()
    recs = records(tmp_path)
    salvaged = next(r["data"] for r in recs if r["type"] == "assistant/message")
    assert salvaged["interrupted"] is True and salvaged["finish"] == "aborted"
    assert [b["type"] for b in salvaged["message"]["content"]] == ["text"]
    assert salvaged["message"]["content"][0]["text"].startswith("Let me")
    # Every delta that was shown is in the log, before the salvaged prefix.
    i = next(n for n, r in enumerate(recs) if r["type"] == "assistant/message")
    logged = [d for r in recs[:i] if r["type"] == "assistant/chunk" for d in r["data"]["deltas"]]
    shown = [e.delta for e in watcher.live(AssistantDelta) if e.turn == 1]
    assert "".join(d["text"] for d in logged) == "".join(d["text"] for d in shown)
    shown_text = "".join(d["text"] for d in shown if d["type"] == "text")
    assert shown_text == salvaged["message"]["content"][0]["text"]
    tail = [r["type"] for r in recs if r["type"] != "assistant/chunk"]
    i = tail.index("assistant/message")
    assert tail[i : i + 3] == ["assistant/message", "step/end", "turn/end"]
    assert turn_ends(tmp_path)[0] == ABORTED_USER
    # The next request carries the prefix (history of turn 2 includes it).
    second_request = model.requests[-1]
    contents = [m.get("content") for m in second_request.messages if m["role"] == "assistant"]
    assert any(c and c.startswith("Let me") for c in contents)
    assert_sound(tmp_path)


async def test_cancel_before_visible_content_writes_no_assistant_message(tmp_path: Path) -> None:
    replies = [{"reasoning": "   ", "text": "", "stall_after_chunks": 1}]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("hello")
        await watcher.wait_type("llm/request")
        agent.cancel(User())
        await agent.when_idle()
        await watcher.close()
    assert "assistant/message" not in kinds(tmp_path)
    assert turn_ends(tmp_path) == [ABORTED_USER]
    assert_sound(tmp_path)


async def test_cancel_while_the_model_stalls_ends_at_once(tmp_path: Path) -> None:
    replies = [{"text": "", "stall_after_chunks": 0}]
    async with agent_for(tmp_path, replies) as agent:
        watcher = Watcher(agent)
        agent.followup("hello")
        await watcher.wait_type("llm/request")
        t = time.monotonic()
        agent.cancel(User())
        await agent.when_idle()
        took = time.monotonic() - t
        await watcher.close()
    assert took < 2.0  # generous; the benchmark measures it
    assert turn_ends(tmp_path) == [ABORTED_USER]


async def test_parallel_calls_are_drained_and_unstarted_ones_skipped_in_order(
    tmp_path: Path,
) -> None:
    calls = [{"name": "cooperative", "arguments": {"seconds": 60}} for _ in range(4)]
    async with agent_for(tmp_path, [{"tool_calls": calls}], workers=2, max_parallel=2) as agent:
        watcher = Watcher(agent)
        agent.followup("read four files")
        await watcher.wait_type("tool/started", call_id="c1-1-1")
        await watcher.wait_type("tool/started", call_id="c1-1-2")
        agent.cancel(User())
        await agent.when_idle()
        await watcher.close()
    recs = [r for r in records(tmp_path) if r["type"] in ("tool/call", "tool/result")]
    sequence = [(r["type"], r["data"]["call_id"]) for r in recs]
    results = [r for r in recs if r["type"] == "tool/result"]
    assert [r["data"]["call_id"] for r in results] == ["c1-1-1", "c1-1-2", "c1-1-3", "c1-1-4"]
    codes = [r["data"]["error"]["code"] for r in results]
    assert codes == ["ABORTED", "ABORTED", "ABORTED_BEFORE_DISPATCH", "ABORTED_BEFORE_DISPATCH"]
    assert sequence[-4:] == [
        ("tool/call", "c1-1-3"),
        ("tool/result", "c1-1-3"),
        ("tool/call", "c1-1-4"),
        ("tool/result", "c1-1-4"),
    ]
    assert results[2]["data"]["content"] == "Error: tool call aborted before dispatch"
    assert turn_ends(tmp_path) == [ABORTED_USER]
    assert_sound(tmp_path)


async def test_cancel_while_bash_runs_the_tree_ends_after_the_tree_is_gone(
    tmp_path: Path,
) -> None:
    ticks = tmp_path / "ticks"
    command = benchmark_tree(str(ticks))
    replies = [{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}]
    grace = GracePolicy(term_after=10.0, kill_after=10.0)
    async with agent_for(tmp_path / "s", replies, grace=grace) as agent:
        watcher = Watcher(agent)
        agent.followup("build")
        await watcher.wait_output("ready")
        agent.cancel(User())
        await agent.when_idle()
        await watcher.close()
        assert session_leftovers(tmp_path / "s", "c1-1-1") == []  # before the agent is closed
    folder = tmp_path / "s"
    stages = [r["data"]["stage"] for r in records(folder) if r["type"] == "tool/signal"]
    assert stages[0] == "interrupt" and "sweep-term" in stages
    result = next(r["data"] for r in records(folder) if r["type"] == "tool/result")
    assert result["error"]["code"] == "ABORTED"
    assert result["strays_killed"] >= 45
    assert turn_ends(folder) == [ABORTED_USER]
    assert_sound(folder)


async def test_wake_latch_replays_a_followup_sent_while_the_turn_unwinds(
    tmp_path: Path,
) -> None:
    # Turn 1 runs a tool that ignores SIGINT; the cancel's grace keeps it unwinding while B
    # arrives. B must run as turn 2 with no further send, and parked A before it.
    replies: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {
                        "command": "trap '' INT; echo ready; while :; do sleep 0.05; done"
                    },
                }
            ]
        },
        {"text": "ran parked A"},
        {"text": "ran B"},
    ]
    grace = GracePolicy(term_after=0.3, kill_after=1.0)
    async with agent_for(tmp_path, replies, grace=grace) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await watcher.wait_output("ready")
        agent.followup("A (queued before the cancel)")
        agent.cancel(User(), keep_inbox=True)
        await watcher.wait_type("tool/signal", stage="interrupt")
        assert agent.status == "running"  # still unwinding: the tool ignores SIGINT
        agent.followup("B (sent while unwinding)")
        await agent.when_idle()
        await watcher.close()
    recs = records(tmp_path)
    order = [
        (r["type"], r["data"].get("turn")) for r in recs if r["type"] in ("turn/start", "turn/end")
    ]
    assert order == [
        ("turn/start", 1),
        ("turn/end", 1),
        ("turn/start", 2),
        ("turn/end", 2),
        ("turn/start", 3),
        ("turn/end", 3),
    ]
    users = [r["data"]["message"]["content"] for r in recs if r["type"] == "user/message"]
    assert users == ["one", "A (queued before the cancel)", "B (sent while unwinding)"]
    assert turn_ends(tmp_path)[0] == ABORTED_USER
    assert_sound(tmp_path)


async def test_plain_cancel_after_the_latch_clears_it(tmp_path: Path) -> None:
    replies = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {
                        "command": "trap '' INT; echo ready; while :; do sleep 0.05; done"
                    },
                }
            ]
        },
    ]
    grace = GracePolicy(term_after=0.3, kill_after=1.0)
    async with agent_for(tmp_path, replies, grace=grace) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await watcher.wait_output("ready")
        agent.cancel(User(), keep_inbox=True)
        await watcher.wait_type("tool/signal", stage="interrupt")
        agent.followup("B")
        agent.cancel(User())  # clears B and the latch
        await agent.when_idle()
        await watcher.close()
    assert len(turn_ends(tmp_path)) == 1
    spliced = [r["data"] for r in records(tmp_path) if r["type"] == "agent/inbox/spliced"]
    assert spliced[-1].get("outcome") == "canceled"
    assert_sound(tmp_path)


async def test_a_steer_after_the_abort_becomes_a_followup(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {
                        "command": "trap '' INT; echo ready; while :; do sleep 0.05; done"
                    },
                }
            ]
        },
        {"text": "the steer ran as its own turn"},
    ]
    grace = GracePolicy(term_after=0.3, kill_after=1.0)
    async with agent_for(tmp_path, replies, grace=grace) as agent:
        watcher = Watcher(agent)
        agent.followup("one")
        await watcher.wait_output("ready")
        agent.cancel(User(), keep_inbox=True)
        agent.steer("actually, do this instead")
        await agent.when_idle()
        await watcher.close()
    recs = records(tmp_path)
    inserted = [
        r["data"] for r in recs if r["type"] == "agent/inbox/spliced" and r["data"]["inserted"]
    ]
    assert inserted[-1]["target"] == "next-turn"
    entered = [
        (r["data"]["turn"], r["data"]["message"]["source"])
        for r in recs
        if r["type"] == "user/message"
    ]
    assert entered == [(1, "user"), (2, "steer")]
    assert_sound(tmp_path)
