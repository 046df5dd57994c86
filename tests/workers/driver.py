"""A driver program that owns a pool, for tests that kill or signal it from outside.

Usage: python -m tests.workers.driver MODE

It starts a pool, runs a ``bash`` call that prints ``ready`` and sleeps, then prints one JSON line
with the pids involved. On SIGTERM it cancels the call (as ``andon run`` does) and prints the
call's outcome as a second JSON line before closing the pool.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from andon.base import AbortController, Disposed
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.testing import SHELL_SLEEP
from andon.workers import default
from tests.workers.support import Recorder


async def main(mode: str) -> None:
    registry = default()
    config = WorkerPoolConfig(size=2, containment=mode)  # type: ignore[arg-type]
    async with WorkerPool(config, registry) as pool:
        await pool.wait_started()  # both workers, each with its pid, for the test to watch
        executor = ToolExecutor(pool, registry)
        controller = AbortController()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, controller.abort, Disposed())
        recorder = Recorder()
        request = ToolCallRequest(
            "c1-1-1", "bash", json.dumps({"command": SHELL_SLEEP}), os.getcwd()
        )
        task = asyncio.create_task(executor.execute(request, controller.signal, recorder))
        recorder.follow(task)
        await recorder.wait_output()
        assert recorder.started is not None
        print(
            json.dumps(
                {
                    "workers": list(pool.workers.values()),
                    "tool": recorder.started.pid,
                    "owner": executor.identity,
                }
            ),
            flush=True,
        )
        outcome = await task
        code = outcome.error.code if outcome.error else None
        print(json.dumps({"ended_by": outcome.ended_by, "code": code}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
