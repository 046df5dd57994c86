"""agent.events(): records as written, typed live events, replay from a seq, and the codec that
turns each event into the JSON object of ``andon run --json`` and back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from andon.session import (
    AgentError,
    AgentEvent,
    AgentStatus,
    AssistantDelta,
    Record,
    SubagentEvent,
    ToolOutput,
    TurnStart,
    check,
    event_from_dict,
    history,
    read,
)
from tests.supervisor.support import agent_for


async def test_events_from_since_seq_replays_then_follows_live(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "first"},
        {"text": "second", "tool_calls": [{"name": "bash", "arguments": {"command": "echo out"}}]},
        {"text": "done"},
    ]
    async with agent_for(tmp_path, replies) as agent:
        agent.followup("one")
        await agent.when_idle()
        stream = agent.events(since_seq=2)
        agent.followup("two")
        await agent.when_idle()
    # Read after the close: the replay from disk, then what was queued live (records already
    # replayed are skipped), then the end of the stream.
    seen: list[AgentEvent] = [item async for item in stream]
    logged = read(tmp_path)
    replayed = [i for i in seen if isinstance(i, Record)]
    assert replayed == [r for r in logged if r.seq >= 2]  # no gap, no duplicate, the same values
    live = [i for i in seen if not isinstance(i, Record)]
    assert AgentStatus("running") in live
    assert any(isinstance(i, ToolOutput) and "out" in i.text for i in live)


async def test_the_folds_take_what_events_yields(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "run", "tool_calls": [{"name": "bash", "arguments": {"command": "echo out"}}]},
        {"text": "done"},
    ]
    async with agent_for(tmp_path, replies) as agent:
        stream = agent.events(since_seq=0)
        agent.followup("one")
        await agent.when_idle()
    seen = [item async for item in stream]
    assert any(not isinstance(i, Record) for i in seen)  # live events among the records
    assert history(seen) == history(read(tmp_path))  # the live ones are skipped
    assert check(seen) == []


async def test_events_end_when_the_agent_closes(tmp_path: Path) -> None:
    async with agent_for(tmp_path, []) as agent:
        stream = agent.events()
    items = [item async for item in stream]
    assert items == []


LIVE_JSON: list[tuple[AgentEvent, dict[str, Any]]] = [
    (AgentStatus("idle"), {"type": "agent/status", "status": "idle"}),
    (
        AgentError("SERVER", "500"),
        {"type": "agent/error", "error": {"code": "SERVER", "message": "500"}},
    ),
    (
        AssistantDelta(1, 2, 3, {"type": "text", "text": "Hi"}),
        {
            "type": "assistant/delta",
            "turn": 1,
            "step": 2,
            "attempt": 3,
            "delta": {"type": "text", "text": "Hi"},
        },
    ),
    (ToolOutput("c1-1-1", "out\n"), {"type": "tool/output", "call_id": "c1-1-1", "text": "out\n"}),
    (
        SubagentEvent("c1-1-2", Record(4, 1.5, TurnStart(1))),
        {
            "type": "subagent/event",
            "call_id": "c1-1-2",
            "event": {"seq": 4, "time": 1.5, "type": "turn/start", "data": {"turn": 1}},
        },
    ),
    (
        SubagentEvent("c1-1-2", SubagentEvent("c1-1-1", ToolOutput("c1-1-1", "x"))),
        {
            "type": "subagent/event",
            "call_id": "c1-1-2",
            "event": {
                "type": "subagent/event",
                "call_id": "c1-1-1",
                "event": {"type": "tool/output", "call_id": "c1-1-1", "text": "x"},
            },
        },
    ),
]


@pytest.mark.parametrize(("event", "obj"), LIVE_JSON, ids=lambda v: getattr(v, "type", ""))
def test_a_live_event_is_its_json_object_and_back(event: AgentEvent, obj: dict[str, Any]) -> None:
    assert event.to_dict() == obj
    assert list(event.to_dict()) == list(obj)  # the key order too: --json lines are compared
    assert event_from_dict(obj) == event


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        ({"type": "agent/status", "status": "asleep"}, "agent/status.status is 'asleep'"),
        ({"type": "agent/bored"}, "type 'agent/bored', not one of agent/error"),
        ({"type": "tool/output", "call_id": "c1"}, "tool/output has no 'text'"),
        ("agent/status", "an event is a JSON object, not str"),
    ],
)
def test_a_bad_event_is_named(obj: object, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        event_from_dict(obj)
