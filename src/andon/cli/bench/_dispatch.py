"""``andon bench dispatch``: a no-op Python tool round trip through the pool beside two floors
measured in the same run — a raw zmq.asyncio round trip, and a bare fork-and-wait of this warm
Python process (a Python call runs in a call process forked from its worker); goal ≤ 3× their sum at
p50. Also "zmq round trip + one fsync" (the agent's floor), ``bash -c true`` through the pool vs
``subprocess.run(['true'])``, and calls/second with 1, 2 and 4 workers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from andon.base import AbortController
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.workers import ToolRegistry, default

from . import _floors
from ._stats import ms, summary, table

__all__ = ["echo_round_trips", "run_dispatch"]

_ECHO_SERVER = """
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.bind(sys.argv[1])
print("up", flush=True)
while True:
    frames = s.recv_multipart()
    if frames[-1] == b"stop":
        break
    s.send_multipart(frames)
s.close(0); ctx.term()
"""


async def raw_zmq_round_trips(n: int, folder: str) -> list[float]:
    """The floor: a DEALER → ROUTER echo in another process, frames the size of a run/result."""
    endpoint = f"ipc://{folder}/echo.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER, endpoint], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    server.stdout.readline()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    times = await echo_round_trips(sock, n)
    sock.close(0)
    ctx.term()
    server.wait()
    server.stdout.close()
    return times


async def echo_round_trips(sock: zmq.asyncio.Socket, n: int) -> list[float]:
    """``n`` timed round trips (after 5 untimed) of frames the size of a run/result through an
    echo server on ``sock``, which is then told to stop."""
    payload = [b"h" * 40, b"p" * 200]
    times = []
    for i in range(n + 5):
        t = time.perf_counter()
        await sock.send_multipart(payload)
        await sock.recv_multipart()
        if i >= 5:
            times.append(time.perf_counter() - t)
    await sock.send_multipart([b"stop"])
    return times


def fork_and_wait(n: int) -> list[float]:
    """The call process's floor: fork this (warm) Python process, the child exits at once, reap."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - t)
    return times


async def _dispatch(
    executor: ToolExecutor, request: Callable[[int], ToolCallRequest], n: int
) -> list[float]:
    times = []
    for i in range(n + 5):
        t = time.perf_counter()
        await executor.execute(request(i), AbortController().signal)
        if i >= 5:
            times.append(time.perf_counter() - t)
    return times


async def _throughput(registry: ToolRegistry, size: int, calls: int, tmp: str) -> float:
    async with WorkerPool(WorkerPoolConfig(size=size), registry) as pool:
        await pool.wait_started()  # all workers warm: throughput, not start-up, is measured
        executor = ToolExecutor(pool, registry, session_dir=Path(tmp))

        async def one(i: int) -> None:
            req = ToolCallRequest(f"c7{size}-1-{i + 1}", "noop", "{}", tmp)
            await executor.execute(req, AbortController().signal)

        t = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(calls):
                tg.create_task(one(i))
        return calls / (time.perf_counter() - t)


async def run_dispatch(runs: int, progress: Any) -> tuple[dict[str, Any], str]:
    from ._tools import noop

    registry = default()
    registry.add(noop)
    n = runs * 10
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        progress("dispatch", 0, 4)
        raw = await raw_zmq_round_trips(n, tmp)
        forks = fork_and_wait(n)
        fsync_path = os.path.join(tmp, "fsync")
        fsyncs = [_floors.fsync_once(fsync_path) for _ in range(n)]
        async with WorkerPool(WorkerPoolConfig(size=1), registry) as pool:
            executor = ToolExecutor(pool, registry, session_dir=Path(tmp))
            progress("dispatch", 1, 4)
            noop_rt = await _dispatch(
                executor, lambda i: ToolCallRequest(f"c9-1-{i + 1}", "noop", "{}", tmp), n
            )
            bash_rt = await _dispatch(
                executor,
                lambda i: ToolCallRequest(f"c8-1-{i + 1}", "bash", '{"command": "true"}', tmp),
                n,
            )
        progress("dispatch", 2, 4)
        spawn = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            spawn.append(time.perf_counter() - t)
        progress("dispatch", 3, 4)
        rates = {size: await _throughput(registry, size, n, tmp) for size in (1, 2, 4)}
    rows = {
        "raw zmq.asyncio round trip (floor)": summary(raw),
        "fork + wait of a warm Python (floor)": summary(forks),
        "raw round trip + fork (floor sum)": summary(
            [a + b for a, b in zip(raw, forks, strict=False)]
        ),
        "raw zmq round trip + one fsync": summary(
            [a + b for a, b in zip(raw, fsyncs, strict=False)]
        ),
        "no-op Python tool through the pool": summary(noop_rt),
        "bash -c true through the pool": summary(bash_rt),
        "subprocess.run(['true'])": summary(spawn),
    }
    noop_p50 = rows["no-op Python tool through the pool"]["p50"]
    ratio = noop_p50 / rows["raw zmq.asyncio round trip (floor)"]["p50"]
    floor_sum = (
        rows["raw zmq.asyncio round trip (floor)"]["p50"]
        + rows["fork + wait of a warm Python (floor)"]["p50"]
    )
    data: dict[str, Any] = {
        "round_trip": rows,
        "noop_ratio_p50": ratio,
        "noop_vs_floor_sum_p50": noop_p50 / floor_sum,
        "calls_per_second": {str(k): v for k, v in rates.items()},
    }
    text = "\n".join(
        [
            f"dispatch round trip (ms), {n} calls each",
            table(
                ["path", "p50", "p95", "p99", "max"],
                [
                    [k, ms(s["p50"]), ms(s["p95"]), ms(s["p99"]), ms(s["max"])]
                    for k, s in rows.items()
                ],
            ),
            f"no-op / (raw round trip + fork) at p50: {noop_p50 / floor_sum:.2f}x (goal <= 3x); "
            f"no-op / raw round trip alone: {ratio:.2f}x",
            "no-op calls/second: " + ", ".join(f"{k} worker(s) {v:.0f}" for k, v in rates.items()),
        ]
    )
    return data, text
