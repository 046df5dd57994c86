"""Shared pieces for the worker tests: a pool + executor per test, and an observer that lets a
test wait for events (output seen, stage sent) instead of sleeping."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from andon.base import AbortController, AbortSignal, Clock, GracePolicy
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.protocol import Started
from andon.supervisor import ExecutionObserver, ToolCallRequest, ToolExecutor, ToolOutcome
from andon.workers import ToolRegistry, default, detect_mode
from tests.support import call_entry, leftovers

try:
    detect_mode("cgroup")
    _CGROUP = True
except ValueError:
    _CGROUP = False

MODES = [
    pytest.param(
        "cgroup", marks=pytest.mark.skipif(not _CGROUP, reason="no writable cgroup v2 here")
    ),
    "subreaper",
    "pgroup",
]


class Recorder(ExecutionObserver):
    def __init__(self) -> None:
        self.output = bytearray()
        self.started: Started | None = None
        self.signals: list[tuple[str, float, int]] = []
        self._changed = asyncio.Event()
        self._call: asyncio.Task[ToolOutcome] | None = None

    def follow(self, call: asyncio.Task[ToolOutcome]) -> None:
        """Watch ``call`` too: a wait for an event the call can no longer send (it has ended)
        fails at once, saying how the call ended, instead of waiting forever."""
        self._call = call
        call.add_done_callback(lambda _t: self._poke())

    def on_started(self, started: Started, worker: str = "") -> None:
        self.started = started
        self._poke()

    def on_signal(self, call_id: str, stage: str, at: float, targets: int) -> None:
        self.signals.append((stage, at, targets))
        self._poke()

    def on_output(self, call_id: str, data: bytes) -> None:
        self.output += data
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, predicate: Any) -> None:
        while not predicate():
            call = self._call
            if call is not None and call.done():
                ended = "cancelled" if call.cancelled() else repr(call.exception() or call.result())
                raise AssertionError(f"the call ended before what the test waits for: {ended}")
            await self._changed.wait()

    async def wait_output(self, needle: bytes = b"ready") -> None:
        await self.wait_until(lambda: needle in self.output)

    async def wait_stage(self, stage: str) -> None:
        await self.wait_until(lambda: any(s == stage for s, _, _ in self.signals))

    @property
    def stages(self) -> list[str]:
        return [s for s, _, _ in self.signals]


@asynccontextmanager
async def running_pool(
    mode: str,
    *,
    size: int = 1,
    registry: ToolRegistry | None = None,
    grace: GracePolicy | None = None,
    clock: Clock | None = None,
    session_dir: Path | None = None,
    **executor_options: Any,
) -> AsyncIterator[tuple[WorkerPool, ToolExecutor]]:
    reg = registry or default()
    config = WorkerPoolConfig(size=size, containment=mode)  # type: ignore[arg-type]
    async with WorkerPool(config, reg) as pool:
        # start() returns once one worker is ready; these tests count on every worker.
        await pool.wait_started()
        executor = ToolExecutor(
            pool, reg, grace=grace, clock=clock, session_dir=session_dir, **executor_options
        )
        yield pool, executor


def bash(call_id: str, command: str, **extra: Any) -> ToolCallRequest:
    import json

    return ToolCallRequest(call_id, "bash", json.dumps({"command": command, **extra}), os.getcwd())


async def start(
    executor: ToolExecutor, request: ToolCallRequest, signal: AbortSignal | None = None
) -> tuple[asyncio.Task[ToolOutcome], Recorder, AbortController]:
    controller = AbortController()
    recorder = Recorder()
    task = asyncio.create_task(executor.execute(request, signal or controller.signal, recorder))
    recorder.follow(task)
    return task, recorder, controller


def call_processes(executor: ToolExecutor, call_id: str) -> list[int]:
    """Processes of this executor's call ``call_id`` still alive after a bounded wait."""
    return [p.pid for p in leftovers(call_entry(executor.identity, call_id))]
