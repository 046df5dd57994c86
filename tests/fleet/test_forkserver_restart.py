"""The workers' forkserver can end under a pool: a tool kills it (``pkill`` of the wrong
process), or it dies as it starts (a broken interpreter set-up). A replacement worker must still
start, through a new forkserver, and when none can, a call waiting for a worker gets an answer
instead of waiting forever (docs/workers.md, Starting workers)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from andon import procs
from andon.base import ErrorCode, WorkerError
from andon.fleet import (
    ForkserverLauncher,
    LaunchedWorker,
    WorkerPool,
    WorkerPoolConfig,
    WorkerSpec,
    _forkserver,
)
from andon.supervisor import ToolCallRequest, ToolExecutor
from tests.workers.pytools import more_tools
from tests.workers.support import start


def _request(command: str, call_id: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), os.getcwd())


async def _lose_the_worker(pool: WorkerPool, executor: ToolExecutor) -> None:
    """A call whose tool kills its worker: the pool must start a replacement."""
    task, _, _ = await start(executor, _request("kill -9 $PPID", "c1-1-1"))
    outcome = await asyncio.wait_for(task, 30)
    assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST


def _kill_the_forkserver() -> int:
    pid = _forkserver._forkserver_pid()
    assert pid is not None
    assert procs.kill_child(pid, signal.SIGKILL)
    return pid


async def test_a_killed_forkserver_gets_a_new_one() -> None:
    async with WorkerPool(WorkerPoolConfig(size=1), more_tools()) as pool:
        executor = ToolExecutor(pool, pool.registry)
        killed = _kill_the_forkserver()
        await _lose_the_worker(pool, executor)
        task, _, _ = await start(executor, _request("echo still-here", "c1-2-1"))
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.error is None and outcome.content.startswith("still-here")
        now = _forkserver._forkserver_pid()
        assert now is not None and now != killed
    with pytest.raises(ChildProcessError):  # the killed one was reaped, not left a zombie
        os.waitid(os.P_PID, killed, os.WEXITED | os.WNOHANG)  # noqa: ASYNC222 (WNOHANG)


class _Failures(ForkserverLauncher):
    """Local workers; counts the starts that failed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        try:
            return await super().start(spec)
        except Exception:
            self.failed += 1
            raise


async def test_a_forkserver_that_ends_as_it_starts_is_replaced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first forkserver exits 3 while it imports (a module of its preload, found in the
    working directory it inherits); the same start tries a new one, which serves."""
    caplog.set_level("INFO", logger="andon.pool")
    module = f"dies_once_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "import os\n"
        "if not os.path.exists('died'):\n"
        "    open('died', 'w').close()\n"
        "    os._exit(3)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_forkserver, "_PRELOAD", [module, *_forkserver._PRELOAD])
    assert _forkserver._forkserver_pid() is None  # no pool open: this test's pool starts it
    launcher = _Failures()
    async with WorkerPool(WorkerPoolConfig(size=1), more_tools(), launcher=launcher) as pool:
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _request("echo served", "c1-1-1"))
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.error is None and outcome.content.startswith("served")
    assert (tmp_path / "died").exists()
    assert launcher.failed == 0  # not a second start of the pool's: the first one's retry
    assert "the workers' forkserver ended (exit status 3); starting a new one" in caplog.text


async def test_when_no_worker_can_start_a_waiting_call_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def cannot(env: dict[str, str]) -> None:
        raise OSError("no forkserver can start here")

    async with WorkerPool(WorkerPoolConfig(size=1), more_tools()) as pool:
        executor = ToolExecutor(pool, pool.registry)
        monkeypatch.setattr(_forkserver, "_spawn", cannot)
        _kill_the_forkserver()
        await _lose_the_worker(pool, executor)
        with pytest.raises(WorkerError, match="no tool worker could be started"):
            await asyncio.wait_for(pool.acquire(), 30)
