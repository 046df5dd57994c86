"""A failure inside the executor answers the call, stops it, and gives its worker back (or
replaces it): with one worker, the next call runs (docs/agent-loop.md, Tool calls; docs/workers.md).

Each failure here is a real one: an argument the wire cannot carry (an integer beyond 64 bits, a
lone surrogate, nesting deeper than the protocol takes, a message over its size limit), a name to
scrub from the environment that the wire cannot carry, an observer writing to a full disk
(``/dev/full``: every write fails with ENOSPC), a task cancelled under its call. Arguments are
the model's mistake (``INVALID_ARGUMENTS``, naming the field, and the turn goes on); the rest are
andon's (``INTERNAL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import andon
from andon.base import AbortController, ErrorCode, GracePolicy, ManualClock, User
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.llm import Scripted
from andon.protocol import Started
from andon.supervisor import Agent, ToolCallRequest, ToolExecutor
from tests.supervisor.support import assert_sound, records, turn_ends
from tests.workers.pytools import data_tools, registry
from tests.workers.support import Recorder, bash, call_processes, running_pool, start

HUGE = 123456789012345678901234567890  # beyond 64 bits: msgpack cannot carry it


@asynccontextmanager
async def _agent(
    folder: Path, replies: list[dict[str, Any]], pool: WorkerPool | None = None
) -> AsyncIterator[Agent]:
    async with andon.open_agent(
        folder,
        model=Scripted(replies),
        tools=registry(),
        pool=WorkerPoolConfig(size=1, containment="subreaper"),
        workers=pool,
        grace=GracePolicy(term_after=1.0, kill_after=1.0),
    ) as agent:
        yield agent


def _results(folder: Path) -> dict[str, dict[str, Any]]:
    return {r["data"]["call_id"]: r["data"] for r in records(folder) if r["type"] == "tool/result"}


SECOND: dict[str, Any] = {"tool_calls": [{"name": "bash", "arguments": {"command": "echo second"}}]}


@pytest.mark.parametrize(
    ("call", "field"),
    [
        # A model can write any JSON number; the bash schema takes it as a number.
        (
            {"name": "bash", "arguments": json.dumps({"command": "echo", "timeout": HUGE})},
            "timeout",
        ),
        # Half of a surrogate pair (a model that cut an emoji in two): valid JSON, not UTF-8.
        ({"name": "bash", "arguments": '{"command": "echo \\ud83d"}'}, "command"),
        ({"name": "cooperative", "arguments": json.dumps({"seconds": HUGE})}, "seconds"),
    ],
    ids=["huge-int", "lone-surrogate", "python-huge-int"],
)
async def test_an_argument_the_wire_cannot_carry_is_invalid_and_the_next_call_runs(
    tmp_path: Path, call: dict[str, Any], field: str
) -> None:
    replies = [{"tool_calls": [call]}, SECOND, {"text": "done"}]
    async with _agent(tmp_path, replies) as agent:
        agent.followup("go")
        await asyncio.wait_for(agent.when_idle(), 30)
    results = _results(tmp_path)
    bad = results["c1-1-1"]
    assert bad["error"]["code"] == "INVALID_ARGUMENTS"
    assert bad["ended_by"] == "not-run"
    assert bad["content"].startswith("Error: invalid arguments for ")
    assert f"field {field!r}" in bad["content"]
    # The bad call was the model's, not a failure: the turn went on, on the one worker.
    assert results["c1-2-1"]["content"] == "second\n[exit code 0]"
    assert turn_ends(tmp_path) == [{"kind": "completed"}]
    assert_sound(tmp_path)


def _nested(levels: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return {"data": {"deep": value}}


@pytest.mark.parametrize(
    ("tool", "arguments", "problem"),
    [
        # The protocol takes JSON nested 64 levels deep; a worker answers deeper with an error.
        ("takes_data", _nested(70), "field 'data.deep[0][0]"),
        # Over the message limit (16 MiB): a worker would refuse the frame.
        ("write_file", {"path": "big.txt", "content": "x" * (17 * 1024 * 1024)}, "bytes on the"),
    ],
    ids=["too-deep", "too-large"],
)
async def test_arguments_a_worker_would_refuse_are_invalid_and_cost_no_worker(
    tool: str, arguments: dict[str, Any], problem: str
) -> None:
    async with running_pool("subreaper", registry=data_tools()) as (pool, executor):
        workers = dict(pool.workers)
        request = ToolCallRequest("c1-1-1", tool, json.dumps(arguments), os.getcwd())
        outcome = await asyncio.wait_for(executor.execute(request, AbortController().signal), 30)
        assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
        assert outcome.ended_by == "not-run"
        assert problem in outcome.content
        await _next_call_runs(executor)
        assert dict(pool.workers) == workers  # nothing was sent, nobody was broken


async def test_a_session_folder_whose_name_is_not_utf8_runs_and_the_tool_gets_its_bytes(
    tmp_path: Path,
) -> None:
    # It reaches the tool as ANDON_SESSION: spelled on the wire as a file name (msgpack strings
    # cannot carry the byte) and mapped back by the worker (docs/log-format.md, Text).
    odd = tmp_path / os.fsdecode(b"session-\xff")
    probe = {"command": "printf %s \"$ANDON_SESSION\" | od -An -tx1 | tr -d ' \\n'"}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": probe}]},
        {"text": "done"},
    ]
    async with _agent(odd, replies) as agent:
        agent.followup("go")
        await asyncio.wait_for(agent.when_idle(), 30)
    result = _results(odd)["c1-1-1"]
    assert "error" not in result, result
    assert result["content"] == os.fsencode(odd).hex() + "\n[exit code 0]"
    assert turn_ends(odd) == [{"kind": "completed"}]
    assert_sound(odd)


async def test_a_run_message_andon_cannot_encode_is_internal_and_holds_no_worker(
    tmp_path: Path,
) -> None:
    # A variable to scrub whose name is a lone surrogate (a caller's secret_env): andon's own part
    # of the message, which the wire (msgpack strings) cannot carry. andon's limit, not the
    # model's call.
    tools = registry()
    async with WorkerPool(WorkerPoolConfig(size=1, containment="subreaper"), tools) as pool:
        workers = dict(pool.workers)
        first = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]}]
        folder = tmp_path / "first"
        async with andon.open_agent(
            folder,
            model=Scripted([*first, {"text": "done"}]),
            tools=tools,
            workers=pool,
            secret_env=["ODD_\ud800"],
            grace=GracePolicy(term_after=1.0, kill_after=1.0),
        ) as agent:
            agent.followup("go")
            await asyncio.wait_for(agent.when_idle(), 30)
        failed = _results(folder)["c1-1-1"]
        assert failed["error"]["code"] == "INTERNAL"
        assert failed["ended_by"] == "not-run"
        assert failed["content"].startswith("Error: internal error in andon's executor: ")
        assert "encoding the run message failed" in failed["content"]
        # An INTERNAL result is andon's failure: the turn ends error (docs/log-format.md, Error
        # codes).
        (end,) = turn_ends(folder)
        assert end["kind"] == "error" and end["error"]["code"] == "INTERNAL"
        assert "c1-1-1" in end["error"]["message"]
        # The one worker was never taken: another session on the pool runs at once.
        other = tmp_path / "other"
        async with _agent(other, [SECOND, {"text": "done"}], pool) as agent:
            agent.followup("go")
            await asyncio.wait_for(agent.when_idle(), 30)
        assert _results(other)["c1-1-1"]["content"] == "second\n[exit code 0]"
        assert dict(pool.workers) == workers


async def test_a_full_disk_under_the_spill_keeps_the_call_and_the_next_one_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "tool-output").mkdir()
    (tmp_path / "tool-output" / "c1-1-1.log").symlink_to("/dev/full")  # ENOSPC on every write
    flood = {"command": "head -c 200000 /dev/zero | tr '\\0' x; echo"}
    replies = [{"tool_calls": [{"name": "bash", "arguments": flood}]}, SECOND, {"text": "done"}]
    async with _agent(tmp_path, replies) as agent:
        agent.followup("go")
        await asyncio.wait_for(agent.when_idle(), 30)
    results = _results(tmp_path)
    spilled = results["c1-1-1"]
    # The spill's own failure is a note, not the call's fate: the command ran and succeeded.
    assert spilled["ended_by"] == "exit" and spilled["exit"] == {"code": 0, "signal": None}
    assert "error" not in spilled
    assert "No space left on device" in spilled["content"]
    assert results["c1-2-1"]["content"] == "second\n[exit code 0]"
    assert turn_ends(tmp_path) == [{"kind": "completed"}]


class _FullDiskObserver(Recorder):
    """An observer that writes one of its events to a full disk, as a log there would:
    ``/dev/full`` fails every write with ENOSPC."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing
        self.fd = os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)

    def _write(self, event: str) -> None:
        if event == self.failing:
            os.write(self.fd, f"{event}\n".encode())

    def on_started(self, started: Started, worker: str = "") -> None:
        super().on_started(started, worker)
        self._write("on_started")

    def on_output(self, call_id: str, data: bytes) -> None:
        super().on_output(call_id, data)
        self._write("on_output")

    def on_signal(self, call_id: str, stage: str, at: float, targets: int) -> None:
        super().on_signal(call_id, stage, at, targets)
        self._write("on_signal")


@contextlib.contextmanager
def _full_disk(failing: str) -> Iterator[_FullDiskObserver]:
    observer = _FullDiskObserver(failing)
    try:
        yield observer
    finally:
        os.close(observer.fd)


def _request(kind: str) -> ToolCallRequest:
    if kind == "python":
        return ToolCallRequest("c1-1-1", "cooperative", json.dumps({"seconds": 1000}), os.getcwd())
    return bash("c1-1-1", "echo ready; exec sleep 1000")


async def _next_call_runs(executor: ToolExecutor) -> None:
    after = await asyncio.wait_for(
        executor.execute(bash("c1-2-1", "echo second"), AbortController().signal), 30
    )
    assert after.error is None and after.content == "second\n[exit code 0]"


@pytest.mark.parametrize(
    ("kind", "failing"),
    [("shell", "on_started"), ("shell", "on_output"), ("python", "on_started")],
)
async def test_an_observer_that_fails_stops_the_call_and_answers_it_internal(
    kind: str, failing: str
) -> None:
    async with running_pool("subreaper", registry=registry()) as (pool, executor):
        workers = dict(pool.workers)
        with _full_disk(failing) as observer:
            outcome = await asyncio.wait_for(
                executor.execute(_request(kind), AbortController().signal, observer), 30
            )
        assert outcome.error is not None and outcome.error.code is ErrorCode.INTERNAL
        assert outcome.is_error
        assert outcome.content.startswith("Error: internal error in andon's executor: ")
        assert f"the observer's {failing} failed: OSError" in outcome.content
        assert "No space left on device" in outcome.content
        # Stopped by the ladder a cancel takes (the worker itself was fine): the cooperative
        # stage ended it, and the stage is logged.
        assert outcome.ended_by == "interrupt"
        assert "andon stopped the call" in outcome.content
        assert call_processes(executor, "c1-1-1") == []
        await _next_call_runs(executor)
        assert dict(pool.workers) == workers  # released, not replaced


async def test_a_cancel_still_wins_over_a_failure_while_the_call_drains() -> None:
    async with running_pool("subreaper", registry=registry()) as (_, executor):
        with _full_disk("on_signal") as observer:
            controller = AbortController()
            task = asyncio.create_task(
                executor.execute(_request("shell"), controller.signal, observer)
            )
            await observer.wait_output()
            controller.abort(User())  # the interrupt's report then fails to be written
            outcome = await asyncio.wait_for(task, 30)
        # The real drained result: the call was aborted, and says so.
        assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
        assert outcome.ended_by == "interrupt"
        assert outcome.content.startswith("ready\n[stopped: aborted by user; SIGINT at +")
        assert call_processes(executor, "c1-1-1") == []
        await _next_call_runs(executor)


async def test_cancelling_the_task_under_a_call_kills_the_call_with_its_worker() -> None:
    async with running_pool("subreaper", registry=registry()) as (pool, executor):
        (before,) = pool.workers.values()
        task, rec, _ = await start(executor, _request("shell"))
        await rec.wait_output()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # At once: nothing follows the call any more, so nothing of it may run on.
        assert call_processes(executor, "c1-1-1") == []
        await _next_call_runs(executor)  # on the worker that replaced it
        assert list(pool.workers.values()) != [before]


async def test_the_grace_timeline_is_clock_timers_not_tasks() -> None:
    clock = ManualClock()
    grace = GracePolicy(term_after=2.0, kill_after=3.0)
    async with running_pool("subreaper", grace=grace, clock=clock) as (_, executor):
        # Deaf to SIGINT, so the stop waits for its SIGTERM stage.
        task, rec, controller = await start(
            executor, bash("c1-1-1", "trap '' INT; echo ready; sleep 1000")
        )
        await rec.wait_output()
        tasks = asyncio.all_tasks()
        controller.abort(User())
        await rec.wait_stage("interrupt")
        await clock.wait_for_sleepers(1)  # the SIGTERM stage, armed on the clock
        assert clock.sleepers == 1
        assert asyncio.all_tasks() == tasks  # no task sleeps for it
        clock.advance(2.0)
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.ended_by == "term"
    assert [m.stage for m in outcome.stages] == ["interrupt", "term"]
