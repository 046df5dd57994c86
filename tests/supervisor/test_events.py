"""agent.events(): records as written, live-only events, replay from a seq."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.supervisor.support import agent_for, records


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
    seen: list[dict[str, Any]] = [item async for item in stream]
    logged = [r["seq"] for r in records(tmp_path)]
    seqs = [i["seq"] for i in seen if "seq" in i]
    assert seqs == [s for s in logged if s >= 2]  # no gap, no duplicate
    live = [i for i in seen if "seq" not in i]
    assert {"type": "agent/status", "status": "running"} in live
    assert any(i["type"] == "tool/output" and "out" in i["text"] for i in live)


async def test_events_end_when_the_agent_closes(tmp_path: Path) -> None:
    async with agent_for(tmp_path, []) as agent:
        stream = agent.events()
    items = [item async for item in stream]
    assert items == []
