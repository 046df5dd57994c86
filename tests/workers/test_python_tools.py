"""Python tools run in call processes; one that ignores its signal is stopped by the grace stages
sent to its call's process group, and its worker serves the next call."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from andon.base import AbortController, ErrorCode, GracePolicy, ManualClock, User
from andon.supervisor import ToolCallRequest
from tests.support import fifo_in
from tests.workers.pytools import more_tools, registry
from tests.workers.support import running_pool, start


def call(call_id: str, tool_name: str, /, **arguments: object) -> ToolCallRequest:
    return ToolCallRequest(call_id, tool_name, json.dumps(arguments), os.getcwd())


async def test_cooperative_tool_stops_on_its_signal() -> None:
    async with running_pool("subreaper", registry=registry()) as (_, executor):
        task, rec, controller = await start(executor, call("c1-1-1", "cooperative", seconds=60))
        await rec.wait_until(lambda: rec.started is not None)
        controller.abort(User())
        outcome = await task
    assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
    assert outcome.ended_by == "interrupt"
    assert rec.stages == ["interrupt"]


async def test_python_tool_ignoring_its_signal_is_stopped_at_term_and_its_worker_stays() -> None:
    clock = ManualClock()
    grace = GracePolicy(term_after=1.0, kill_after=1.0)
    async with running_pool("subreaper", registry=registry(), clock=clock, grace=grace) as (
        pool,
        executor,
    ):
        before = dict(pool.workers)
        task, rec, controller = await start(executor, call("c1-1-1", "stubborn_sync", seconds=120))
        await rec.wait_until(lambda: rec.started is not None)
        call_pid = rec.started.pid if rec.started else 0
        assert call_pid not in before.values()  # the tool is not in the worker's process
        controller.abort(User())
        await rec.wait_stage("interrupt")
        clock.advance(1.0)  # SIGTERM to the call's group: its default disposition ends it
        outcome = await task
        assert outcome.ended_by == "term"
        assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED
        assert "[stopped: aborted by user; signal at +0.00s, SIGTERM at +1.00s" in outcome.content
        # The same worker serves the next call: it was never signalled.
        nxt = await executor.execute(call("c1-1-2", "echo_pid"), AbortController().signal)
        assert not nxt.is_error
        assert dict(pool.workers) == before
        assert int(nxt.content) not in (call_pid, *before.values())


async def test_python_tool_kill_stage_when_term_is_not_enough(tmp_path: Path) -> None:
    clock = ManualClock()
    # term_after=inf: only force escalates, sending SIGTERM and SIGKILL to the call's group at
    # once. The tool ignores SIGTERM, so only the KILL ends it.
    grace = GracePolicy(term_after=float("inf"), kill_after=1.0)
    fifo = fifo_in(tmp_path)
    async with running_pool("subreaper", registry=more_tools(), clock=clock, grace=grace) as (
        _,
        executor,
    ):
        task, rec, controller = await start(
            executor, call("c1-1-1", "leaves_things", mode="ignore", ready=str(fifo))
        )
        assert await asyncio.to_thread(fifo.read_text) == "deaf\n"
        controller.abort(User())
        await rec.wait_stage("interrupt")
        executor.force()
        outcome = await task
    assert outcome.ended_by == "kill"
    assert outcome.error is not None and outcome.error.code is ErrorCode.ABORTED


async def test_tool_error_and_bad_calls_are_results() -> None:
    async with running_pool("subreaper", registry=registry()) as (_, executor):
        signal = AbortController().signal
        raised = await executor.execute(call("c1-1-1", "fails", message="boom"), signal)
        unknown = await executor.execute(call("c1-1-2", "nope"), signal)
        invalid = await executor.execute(
            ToolCallRequest("c1-1-3", "bash", '{"command": 3}', os.getcwd()), signal
        )
        not_json = await executor.execute(
            ToolCallRequest("c1-1-4", "bash", '{"command": ', os.getcwd()), signal
        )
        missing = await executor.execute(call("c1-1-5", "read_file"), signal)
    assert raised.error is not None and raised.error.code is ErrorCode.TOOL_ERROR
    assert "RuntimeError: boom" in raised.content
    assert unknown.error is not None and unknown.error.code is ErrorCode.UNKNOWN_TOOL
    assert unknown.ended_by == "not-run"
    assert invalid.error is not None and invalid.error.code is ErrorCode.INVALID_ARGUMENTS
    assert "'command'" in invalid.content
    assert not_json.error is not None and not_json.error.code is ErrorCode.INVALID_ARGUMENTS
    assert "not valid JSON" in not_json.content
    assert missing.error is not None and "'path'" in missing.error.message


async def test_tool_environment_scrubs_api_keys_and_names_the_call() -> None:
    async with running_pool("subreaper", registry=registry()) as (_, executor):
        executor.env_remove = ("PATH_SECRET_FOR_TEST", "HOME")
        signal = AbortController().signal
        home = await executor.execute(call("c1-1-1", "env_probe", name="HOME"), signal)
        call_id = await executor.execute(call("c1-1-2", "env_probe", name="ANDON_CALL_ID"), signal)
        shell = await executor.execute(
            ToolCallRequest(
                "c1-1-3",
                "bash",
                json.dumps({"command": 'echo "$ANDON_CALL_ID:${HOME-unset}"'}),
                os.getcwd(),
            ),
            signal,
        )
    assert home.content == "<unset>"
    assert call_id.content == "c1-1-2"
    assert shell.content.startswith("c1-1-3:unset\n")


async def test_builtin_file_tools(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "a.txt").write_text("one\ntwo\nthree\n")
    async with running_pool("subreaper") as (_, executor):
        signal = AbortController().signal

        async def run(call_id: str, name: str, **args: object) -> str:
            outcome = await executor.execute(
                ToolCallRequest(call_id, name, json.dumps(args), str(root)), signal
            )
            assert not outcome.is_error, outcome.content
            return outcome.content

        assert await run("c1-1-1", "read_file", path="a.txt", offset=2, limit=1) == (
            "two\n\n[lines 2-2 of 3; use offset to read more]"
        )
        await run("c1-1-2", "write_file", path="sub/b.txt", content="hello world\n")
        await run("c1-1-3", "edit_file", path="sub/b.txt", old="world", new="andon")
        assert (root / "sub" / "b.txt").read_text() == "hello andon\n"
        assert await run("c1-1-4", "list_files", path=".") == "a.txt\nsub/b.txt"
        assert await run("c1-1-5", "grep", pattern="andon") == "sub/b.txt:1: hello andon"
        ambiguous = await executor.execute(
            ToolCallRequest(
                "c1-1-6",
                "edit_file",
                json.dumps({"path": "a.txt", "old": "t", "new": "x"}),
                str(root),
            ),
            signal,
        )
    assert ambiguous.is_error and "occurs 2 times" in ambiguous.content
