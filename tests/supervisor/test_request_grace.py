"""A call's own grace policy (``ToolCallRequest.grace``) is the one its stop walks, over the tool's
and the executor's: an MCP server's host call is stopped with SIGINT and SIGTERM at once
(docs/tools.md, MCP servers). On a manual clock that never moves, only a SIGTERM sent at the
stop's beginning can end a command that ignores SIGINT."""

from __future__ import annotations

import asyncio
import os

from andon.base import AbortController, GracePolicy, ManualClock, User
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ExecutionObserver, ToolCallRequest, ToolExecutor
from andon.workers import default


class _Ready(ExecutionObserver):
    def __init__(self) -> None:
        self.ready = asyncio.Event()

    def on_output(self, call_id: str, data: bytes) -> None:
        if b"ready" in data:
            self.ready.set()


async def test_the_requests_grace_is_the_one_its_stop_walks() -> None:
    registry = default()
    async with WorkerPool(WorkerPoolConfig(size=1, containment="subreaper"), registry) as pool:
        # The executor's own policy would wait an hour for SIGTERM: the clock never gets there.
        executor = ToolExecutor(
            pool, registry, clock=ManualClock(), grace=GracePolicy(term_after=3600, kill_after=5)
        )
        request = ToolCallRequest(
            "g1",
            "bash",
            {"command": "trap '' INT; echo ready; exec sleep 1000"},
            os.getcwd(),
            grace=GracePolicy(term_after=0.0, kill_after=3600),
        )
        stop, observer = AbortController(), _Ready()
        task = asyncio.create_task(executor.execute(request, stop.signal, observer))
        await observer.ready.wait()
        stop.abort(User())
        outcome = await task
    assert outcome.ended_by == "term", outcome
    assert [mark.stage for mark in outcome.stages] == ["interrupt", "term"]
