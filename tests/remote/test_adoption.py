"""Workers started by hand in another network namespace, adopted by a pool (``AdoptLauncher``),
and every refusal on either side said in one line: a stranger, a full pool, a client without
CURVE, no worker at all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from andon.base import NoWorkerStarted
from andon.fleet import AdoptLauncher, TcpListen, WorkerPool, WorkerPoolConfig
from andon.protocol import load_keys, load_public_keys, write_keys
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.workers import WORKER_REFUSED, default
from tests.remote.conftest import Hosts, Refusals
from tests.workers.support import running_pool, start

pytestmark = pytest.mark.timeout(120)

WORKER = [sys.executable, "-m", "andon", "worker"]


def _bash(call_id: str, command: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), os.getcwd())


class _Watch(Refusals):
    """Refusals, and each worker the pool adopted (a test waits on them, never polls)."""

    def __init__(self, refused: asyncio.Queue[str]) -> None:
        super().__init__(refused)
        self.adopted: asyncio.Queue[str] = asyncio.Queue()

    def on_adopted(self, worker_id: str, host: str) -> None:
        self.adopted.put_nowait(worker_id)


class _Waiting:
    """The pool's word that a start waits for a worker, with the command line to start one."""

    def __init__(self) -> None:
        self.said: asyncio.Queue[str] = asyncio.Queue()

    def __call__(self, how: str) -> None:
        self.said.put_nowait(how)


def _keys(folder: Path, *names: str) -> list[Path]:
    return [write_keys(folder, name)[1] for name in names]


@asynccontextmanager
async def _adopting(
    hosts: Hosts,
    folder: Path,
    *,
    size: int,
    allowed: list[str],
    wait: float = 60.0,
) -> AsyncIterator[tuple[WorkerPool, _Waiting, _Watch, asyncio.Task[None]]]:
    """An adopting pool on our end of the veth pair, started in the background (its start
    waits for a first worker), with what it says and its start's task."""
    server = load_keys(write_keys(folder, "supervisor")[1])
    config = WorkerPoolConfig(
        size=size,
        heartbeat_interval=0.25,
        tcp=TcpListen(
            f"tcp://{hosts.local_address}:0",
            server_keys=server,
            allowed=frozenset().union(*(load_public_keys(folder / f"{n}.key") for n in allowed)),
        ),
    )
    waiting = _Waiting()
    observer = _Watch(asyncio.Queue())
    pool = WorkerPool(
        config, default(), launcher=AdoptLauncher(wait=wait, on_waiting=waiting), observer=observer
    )
    starting = asyncio.create_task(pool.start())
    try:
        yield pool, waiting, observer, starting
    finally:
        if not starting.done():
            starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await pool.aclose()


def _hand_start(
    hosts: Hosts, pool: WorkerPool, key_file: Path, worker_id: str
) -> subprocess.Popen[bytes]:
    server = pool.server_public_key
    assert server is not None
    return subprocess.Popen(
        [
            *hosts.run_there(),
            *WORKER,
            "--connect",
            pool.endpoint,
            f"--server-key={server.decode()}",
            "--keys",
            str(key_file),
            "--id",
            worker_id,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def _ended(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, str]:
    """Its exit code and what it said on stderr (killed past ``timeout``)."""
    try:
        _, err = await asyncio.to_thread(proc.communicate, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = await asyncio.to_thread(proc.communicate)
    return proc.returncode, err.decode()


async def test_workers_started_by_hand_are_adopted_run_calls_and_are_let_go(
    hosts: Hosts, tmp_path: Path
) -> None:
    one, two = _keys(tmp_path, "one", "two")
    workers: list[subprocess.Popen[bytes]] = []
    try:
        async with _adopting(hosts, tmp_path, size=2, allowed=["one", "two"]) as (
            pool,
            waiting,
            watch,
            _,
        ):
            how = await asyncio.wait_for(waiting.said.get(), 30)
            assert f"--connect {pool.endpoint}" in how and "--server-key=" in how
            workers.append(_hand_start(hosts, pool, one, "build-1"))
            workers.append(_hand_start(hosts, pool, two, "build-2"))
            # Both are taken (the second without a call wanting it: it would give up first).
            adopted = {await asyncio.wait_for(watch.adopted.get(), 30) for _ in range(2)}
            assert adopted == {"build-1", "build-2"} == set(pool.workers)
            executor = ToolExecutor(pool, pool.registry)
            tasks = [
                (
                    await start(
                        executor, _bash(f"c1-1-{i}", "sleep 0.3; readlink /proc/self/ns/net")
                    )
                )[0]
                for i in (1, 2)
            ]
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        ours = os.readlink("/proc/self/ns/net")
        for outcome in outcomes:
            assert outcome.error is None, outcome.content
            assert outcome.content.strip().startswith("net:[") and ours not in outcome.content
        for worker in workers:
            code, err = await _ended(worker)
            assert code == 0, err  # let go by the pool's close
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                await _ended(worker)


async def test_a_worker_beyond_the_pool_size_is_refused_and_says_why(
    hosts: Hosts, tmp_path: Path
) -> None:
    one, two = _keys(tmp_path, "one", "two")
    first: subprocess.Popen[bytes] | None = None
    async with _adopting(hosts, tmp_path, size=1, allowed=["one", "two"]) as (
        pool,
        waiting,
        watch,
        _,
    ):
        await asyncio.wait_for(waiting.said.get(), 30)
        first = _hand_start(hosts, pool, one, "build-1")
        assert await asyncio.wait_for(watch.adopted.get(), 30) == "build-1"
        second = _hand_start(hosts, pool, two, "build-2")
        code, err = await _ended(second)
        reason = await asyncio.wait_for(watch.queue.get(), 30)
        assert "'build-2'" in reason and "all the workers it takes (1)" in reason
    assert code == WORKER_REFUSED, err
    (line,) = err.splitlines()
    assert "refused by the supervisor" in line and "all the workers it takes (1)" in line
    assert first is not None and (await _ended(first))[0] == 0


async def test_no_worker_dialing_in_ends_the_start_with_the_command_line_to_run(
    hosts: Hosts, tmp_path: Path
) -> None:
    _keys(tmp_path, "one")
    async with _adopting(hosts, tmp_path, size=1, allowed=["one"], wait=0.5) as (
        _,
        waiting,
        _,
        starting,
    ):
        await asyncio.wait_for(waiting.said.get(), 30)
        with pytest.raises(NoWorkerStarted) as failed:
            await asyncio.wait_for(starting, 60)
    message = str(failed.value)
    assert "no worker connected to tcp://" in message and "within 0.5s" in message
    assert "andon worker --connect tcp://" in message and "--server-key=" in message


async def test_a_client_without_curve_is_logged_by_the_pool(hosts: Hosts, tmp_path: Path) -> None:
    _keys(tmp_path, "one")
    async with _adopting(hosts, tmp_path, size=1, allowed=["one"]) as (pool, waiting, watch, _):
        await asyncio.wait_for(waiting.said.get(), 30)  # listening
        ctx = zmq.asyncio.Context()
        plain = ctx.socket(zmq.DEALER)
        try:
            plain.connect(pool.endpoint)
            reason = await asyncio.wait_for(watch.queue.get(), 30)
        finally:
            plain.close(linger=0)
            ctx.term()
    # The pool sees the mismatch, or (when the client saw it first) the dropped connection.
    assert "failed the handshake" in reason, reason
    assert "does not speak CURVE" in reason or "a client without CURVE" in reason, reason


async def test_a_stranger_to_a_pool_that_starts_its_own_workers_is_refused() -> None:
    async with running_pool("subreaper") as (pool, _):
        stranger = subprocess.Popen(
            [*WORKER, "--connect", pool.endpoint, "--id", "stranger"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        code, err = await _ended(stranger)
        assert "stranger" not in pool.workers
    assert code == WORKER_REFUSED, err
    (line,) = err.splitlines()
    assert "knows no worker 'stranger'" in line, line
