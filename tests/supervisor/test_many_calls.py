"""A step with thousands of tool calls: a stop writes the queued calls' records as one batch, and
the calls that start together share one durable write of their tool/call records
(docs/log-format.md, Durability)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from andon.base import User
from andon.llm import Scripted
from andon.session import SessionLog
from tests.supervisor.support import Watcher, agent_on, assert_sound, records

CALLS = 10_000


class CountingWrite:
    """The log's write seam: real writes, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int, data: bytes) -> int:
        self.calls += 1
        return os.write(fd, data)


class SizeAtSync:
    """The log's fsync seam: real fsyncs, each noting how long the file was."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, fd: int) -> None:
        self.sizes.append(os.fstat(fd).st_size)
        os.fsync(fd)


def line_ends(folder: Path) -> dict[int, str]:
    """Each record's type by the byte offset just past its line."""
    ends: dict[int, str] = {}
    offset = 0
    raw = (folder / "events.jsonl").read_bytes()
    for line, record in zip(raw.splitlines(keepends=True), records(folder), strict=True):
        offset += len(line)
        ends[offset] = record["type"]
    return ends


@pytest.mark.timeout(180)
async def test_a_stop_with_ten_thousand_queued_calls_writes_them_as_one_batch(
    tmp_path: Path,
) -> None:
    write = CountingWrite()
    log = SessionLog.open(tmp_path, write=write)
    calls = [{"name": "cooperative", "arguments": {"seconds": 60}} for _ in range(CALLS)]
    model = Scripted([{"text": "Checking everything.", "tool_calls": calls}, {"text": "never"}])
    async with agent_on(log, model, tmp_path, max_parallel=2) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await watcher.wait_type("tool/started")
        writes_before = write.calls
        began = time.monotonic()
        agent.cancel(User())
        await agent.when_idle()
        took = time.monotonic() - began
        writes = write.calls - writes_before
        await agent.aclose()
        await watcher.close()
    await log.aclose()
    assert_sound(tmp_path)
    recs = records(tmp_path)
    results = [r["data"] for r in recs if r["type"] == "tool/result"]
    expected = [f"c1-1-{n}" for n in range(1, CALLS + 1)]
    assert [r["call_id"] for r in results] == expected  # each once, in model order
    assert sum(r.get("ended_by") == "not-run" for r in results) >= CALLS - 2
    assert sum(r["type"] == "tool/call" for r in recs) == CALLS
    # The two running calls' records, a batch, step/end and turn/end: a handful of writes, not
    # two per queued call (a stop once took ~20 s here, a record or two at a time).
    assert writes < 40, writes
    assert took < 30, took  # generous: the stop is bounded by the grace, not by the queue


async def test_calls_that_start_together_share_one_fsync_of_their_tool_calls(
    tmp_path: Path,
) -> None:
    fsync = SizeAtSync()
    log = SessionLog.open(tmp_path, fsync=fsync)
    calls = [{"name": "cooperative", "arguments": {"seconds": 0}} for _ in range(8)]
    model = Scripted([{"text": "All at once.", "tool_calls": calls}, {"text": "done"}])
    async with agent_on(log, model, tmp_path, max_parallel=8) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await watcher.wait_type("turn/end")
        await agent.aclose()
        await watcher.close()
    await log.aclose()
    assert_sound(tmp_path)
    ends = line_ends(tmp_path)
    recs = records(tmp_path)
    first_call = next(r["seq"] for r in recs if r["type"] == "tool/call")
    assert [r["type"] for r in recs[first_call : first_call + 8]] == ["tool/call"] * 8
    # Eight slots free at once: their eight tool/call records are made durable by one fsync
    # (before any of them starts), not eight.
    after_calls = [size for size in fsync.sizes if ends.get(size) == "tool/call"]
    assert len(after_calls) == 1, fsync.sizes
    started = [r["seq"] for r in recs if r["type"] == "tool/started"]
    assert min(started) > first_call + 7
