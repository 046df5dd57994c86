"""The workers' forkserver listens on a socket in the temporary folder (multiprocess puts it
there), which a tool's ``rm -rf /tmp/*`` empties. A replacement worker must still start, and when
none can, a call waiting for a worker gets an answer instead of waiting forever."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from andon.base import ErrorCode, WorkerError
from andon.fleet import WorkerPool, WorkerPoolConfig, _forkserver
from andon.supervisor import ToolCallRequest, ToolExecutor
from tests.workers.pytools import more_tools
from tests.workers.support import start


def _forkserver_socket() -> Path:
    from multiprocess import forkserver

    address = forkserver._forkserver._forkserver_address
    assert isinstance(address, str)
    return Path(address)


def _request(command: str, call_id: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), os.getcwd())


async def _lose_the_worker(pool: WorkerPool, executor: ToolExecutor) -> None:
    """A call whose tool kills its worker: the pool must start a replacement."""
    task, _, _ = await start(executor, _request("kill -9 $PPID", "c1-1-1"))
    outcome = await asyncio.wait_for(task, 30)
    assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST


async def test_a_deleted_forkserver_socket_gets_a_new_forkserver() -> None:
    async with WorkerPool(WorkerPoolConfig(size=1), more_tools()) as pool:
        executor = ToolExecutor(pool, pool.registry)
        socket = _forkserver_socket()
        socket.unlink()  # what emptying the temporary folder does to it
        await _lose_the_worker(pool, executor)
        task, _, _ = await start(executor, _request("echo still-here", "c1-2-1"))
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.error is None and outcome.content.startswith("still-here")


async def test_when_no_worker_can_start_a_waiting_call_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def cannot(hidden: frozenset[str]) -> None:
        raise OSError("no forkserver can start here")

    async with WorkerPool(WorkerPoolConfig(size=1), more_tools()) as pool:
        executor = ToolExecutor(pool, pool.registry)
        _forkserver_socket().unlink()
        monkeypatch.setattr(_forkserver, "_restart_forkserver", cannot)
        await _lose_the_worker(pool, executor)
        with pytest.raises(WorkerError, match="no tool worker could be started"):
            await asyncio.wait_for(pool.acquire(), 30)
