"""Workers that die, drivers that die, and frames that cannot be trusted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from andon.base import AbortController, ErrorCode, User
from andon.fleet import PoolObserver, WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolExecutor
from andon.testing import SHELL_SLEEP
from tests.faulty_launcher import FaultyLauncher
from tests.faulty_workers import ErrorBeforeResult, GarbageAfterStarted
from tests.support import REPO, call_entry, leftovers, wait_all_exited
from tests.workers.pytools import registry
from tests.workers.support import MODES, bash, call_processes, running_pool, start

_ONE = WorkerPoolConfig(size=1)
"""One worker (its launcher, a test's FaultyLauncher, says how it runs)."""


@pytest.mark.parametrize("mode", MODES)
async def test_kill_9_of_a_worker_mid_call_gives_worker_lost(mode: str) -> None:
    async with running_pool(mode) as (pool, executor):
        task, rec, _ = await start(executor, bash("c1-1-1", SHELL_SLEEP))
        await rec.wait_output()
        (worker_pid,) = pool.workers.values()
        os.kill(worker_pid, signal.SIGKILL)
        outcome = await task
        assert outcome.ended_by == "worker-lost"
        assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST
        assert "ready" in outcome.content
        assert call_processes(executor, "c1-1-1") == []  # its process group was killed
        nxt = await executor.execute(bash("c1-1-2", "echo after"), AbortController().signal)
        assert nxt.content.startswith("after\n") and not nxt.is_error
        assert worker_pid not in pool.workers.values()


def _start_driver(mode: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.driver", mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a CI job has
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the driver exited before it was ready"
    return proc, json.loads(line)


@pytest.mark.parametrize("mode", MODES)
def test_kill_9_of_the_driver_leaves_no_worker_and_no_tool(mode: str) -> None:
    proc, pids = _start_driver(mode)
    watched = [*pids["workers"], pids["tool"]]  # type: ignore[misc]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()
    survivors = wait_all_exited(watched, timeout=10.0)  # a bound, not a speed figure
    assert survivors == [], f"still alive 10 s after the driver died: {survivors}"
    assert leftovers(call_entry(str(pids["owner"]), "c1-1-1")) == []


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_to_the_drivers_group_is_not_a_worker_loss(mode: str) -> None:
    proc, _ = _start_driver(mode)
    os.killpg(proc.pid, signal.SIGTERM)  # the driver and its forkserver
    assert proc.stdout is not None
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"ended_by": "interrupt", "code": "ABORTED"}


async def test_garbage_sent_to_a_worker_gets_an_error_and_it_keeps_serving() -> None:
    async with running_pool("subreaper") as (pool, executor):
        ((worker_id, worker_pid),) = pool.workers.items()
        assert pool._wire is not None
        for garbage in ([b"\xc1\xc1"], [b"\x80", b"\x80"], [b"x" * 10, b"y", b"z"]):
            await pool._wire.sock.send_multipart([worker_id.encode(), *garbage])
        outcome = await executor.execute(
            bash("c1-1-1", "echo still-here"), AbortController().signal
        )
        assert outcome.content.startswith("still-here\n")
        assert pool.workers == {worker_id: worker_pid}
        replies = pool.statistics().error_replies
        assert len(replies) == 3
        assert all(who == worker_id for who, _ in replies)


async def test_a_worker_that_sends_garbage_is_killed_and_replaced() -> None:
    broken: list[tuple[str, str]] = []

    class Broken(PoolObserver):
        def on_broken(self, worker_id: str, reason: str) -> None:
            broken.append((worker_id, reason))

    launcher = FaultyLauncher([], then=GarbageAfterStarted)
    reg = registry()
    async with WorkerPool(_ONE, reg, observer=Broken(), launcher=launcher) as pool:
        executor = ToolExecutor(pool, reg)
        (old_pid,) = pool.workers.values()
        outcome = await executor.execute(bash("c1-1-1", SHELL_SLEEP), AbortController().signal)
        assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST
        assert "bad frame" in outcome.error.message
        assert len(broken) == 1 and "bad frame" in broken[0][1]
        assert old_pid not in pool.workers.values()
        # The call's processes went with the worker: found by the call's tag.
        assert leftovers(call_entry(executor.identity, "c1-1-1")) == []


async def test_an_observer_that_raises_does_not_stop_the_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Raising(PoolObserver):
        def on_broken(self, worker_id: str, reason: str) -> None:
            raise RuntimeError("the observer's own bug")

    launcher = FaultyLauncher([], then=GarbageAfterStarted)
    reg = registry()
    async with WorkerPool(_ONE, reg, observer=Raising(), launcher=launcher) as pool:
        executor = ToolExecutor(pool, reg)
        outcome = await executor.execute(bash("c1-1-1", SHELL_SLEEP), AbortController().signal)
        assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST
        assert "the pool's observer raised" in caplog.text
        # The pool goes on: a replacement takes the next call (and, faulty too, is lost again).
        again = await executor.execute(bash("c1-1-2", SHELL_SLEEP), AbortController().signal)
        assert again.error is not None and again.error.code is ErrorCode.WORKER_LOST


async def test_a_result_after_an_error_reply_does_not_replace_worker_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that answers an error about its call is written off; the result it sends right
    behind the error is not believed, even when both are queued before the executor reads the
    first (docs/workers.md, The grace policy). Each trial is a fresh worker (the last one was
    killed), so the trials are independent; whether the result is queued before the executor
    handles the error depends on how the frames arrive, and the answer must not."""
    launcher = FaultyLauncher([], then=ErrorBeforeResult)
    reg = registry()
    caplog.set_level("WARNING", logger="andon.executor")
    async with WorkerPool(_ONE, reg, launcher=launcher) as pool:
        executor = ToolExecutor(pool, reg)
        for i in range(12):
            call = f"c1-{i + 1}-1"
            outcome = await executor.execute(bash(call, "echo done"), AbortController().signal)
            assert outcome.ended_by == "worker-lost", (call, outcome.content)
            assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST
            assert "an error before the result" in outcome.error.message
            assert leftovers(call_entry(executor.identity, call)) == []


async def test_cancel_for_a_finished_call_is_ignored() -> None:
    async with running_pool("subreaper") as (pool, executor):
        done = await executor.execute(bash("c1-1-1", "true"), AbortController().signal)
        assert done.exit_code == 0
        from andon.protocol import Cancel

        lease = await pool.acquire()
        await lease.send(Cancel(call_id="c1-1-1", stage="kill"))
        lease.release()
        task, rec, controller = await start(executor, bash("c1-1-2", SHELL_SLEEP))
        await rec.wait_output()
        controller.abort(User())
        outcome = await task
        assert outcome.ended_by == "interrupt"
        assert pool.statistics().error_replies == ()


@pytest.mark.parametrize("mode", [MODES[0]])
async def test_a_dead_supervisors_cgroup_tree_is_swept_at_the_next_start(mode: str) -> None:
    from pathlib import Path

    from andon.workers._containment import cgroup2_root

    root = cgroup2_root()
    assert root is not None
    from andon import procs

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer exists
    stale = Path(root) / f"andon-{gone.pid}-s1-ns{procs.pid_namespace()}-0123abcd"
    (stale / "call-c1-1-1").mkdir(parents=True)
    (stale / "worker-w1").mkdir()
    async with running_pool(mode):
        assert not stale.exists()
