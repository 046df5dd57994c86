"""``andon bench dispatch``: a no-op Python tool round trip through the pool beside two floors
measured in the same run — a raw zmq.asyncio round trip, and a bare fork-and-wait of this warm
Python process (a Python call runs in a call process forked from its worker); goal ≤ 2× their sum at
p50, and ≤ 2 ms of CPU per call. Also "zmq round trip + one fsync" (the agent's floor), ``bash -c
true`` through the pool vs ``subprocess.run(['true'])``, and calls/second with 1, 2 and 4 workers.

Every path reports its CPU time per call beside its wall time: the mean over the run, of every
process the path uses (this one, the echo server or the pool's workers, and the children they
reaped: call processes, ``bash``, spares), read from the kernel's own accounting."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from andon import procs
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


def own_cpu() -> float:
    """CPU seconds of this process and the children it has reaped."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def pool_cpu(pool: WorkerPool) -> float:
    """CPU seconds of this process (the supervisor) and the pool's workers, with what they
    reaped."""
    return own_cpu() + sum(procs.cpu_time(pid) for pid in pool.workers.values())


async def raw_zmq_round_trips(n: int, folder: str) -> tuple[list[float], float]:
    """The floor: a DEALER → ROUTER echo in another process, frames the size of a run/result.
    Returns the round trips and the CPU seconds per round trip (both processes)."""
    endpoint = f"ipc://{folder}/echo.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER, endpoint], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    server.stdout.readline()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    before = own_cpu() + procs.cpu_time(server.pid)
    cpu = [0.0]

    def measured() -> None:
        cpu[0] = own_cpu() + procs.cpu_time(server.pid) - before

    times = await echo_round_trips(sock, n, measured)
    sock.close(0)
    ctx.term()
    server.wait()
    server.stdout.close()
    return times, cpu[0] / (n + 5)


async def echo_round_trips(
    sock: zmq.asyncio.Socket, n: int, done: Callable[[], None] | None = None
) -> list[float]:
    """``n`` timed round trips (after 5 untimed) of frames the size of a run/result through an
    echo server on ``sock``, which is then told to stop (``done`` is called right before)."""
    payload = [b"h" * 40, b"p" * 200]
    times = []
    for i in range(n + 5):
        t = time.perf_counter()
        await sock.send_multipart(payload)
        await sock.recv_multipart()
        if i >= 5:
            times.append(time.perf_counter() - t)
    if done is not None:
        done()
    await sock.send_multipart([b"stop"])
    return times


def fork_and_wait(n: int) -> list[float]:
    """The call process's floor: fork this (warm) Python process, the child exits at once, reap."""
    return _timed_forks(n)[0]


def _timed_forks(n: int) -> tuple[list[float], float]:
    """:func:`fork_and_wait`, and the CPU seconds per fork (parent and child)."""
    times = []
    before = own_cpu()
    for _ in range(n):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - t)
    return times, (own_cpu() - before) / n


async def _dispatch(
    pool: WorkerPool,
    executor: ToolExecutor,
    request: Callable[[int], ToolCallRequest],
    n: int,
) -> tuple[list[float], float]:
    """``n`` timed calls (after 5 untimed), and the CPU seconds per timed call."""
    times = []
    before = 0.0
    for i in range(n + 5):
        if i == 5:
            before = pool_cpu(pool)
        t = time.perf_counter()
        await executor.execute(request(i), AbortController().signal)
        if i >= 5:
            times.append(time.perf_counter() - t)
    return times, (pool_cpu(pool) - before) / n


async def _throughput(
    registry: ToolRegistry, size: int, calls: int, tmp: str
) -> tuple[float, float]:
    """Calls per second with ``size`` workers, and the CPU seconds per call."""
    async with WorkerPool(WorkerPoolConfig(size=size), registry) as pool:
        await pool.wait_started()  # all workers warm: throughput, not start-up, is measured
        executor = ToolExecutor(pool, registry, session_dir=Path(tmp))

        async def one(i: int) -> None:
            req = ToolCallRequest(f"c7{size}-1-{i + 1}", "noop", "{}", tmp)
            await executor.execute(req, AbortController().signal)

        before = pool_cpu(pool)
        t = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(calls):
                tg.create_task(one(i))
        elapsed = time.perf_counter() - t
        return calls / elapsed, (pool_cpu(pool) - before) / calls


_ECHO = str(Path(__file__).with_name("_mcp_echo.py"))


def bare_mcp_round_trips(n: int) -> tuple[list[float], float]:
    """The MCP row's floor: the same echo server, started bare, called over its own pipes by a
    client that writes a ``tools/call`` line and reads the answer's line (after 5 untimed); the
    round trips and the CPU seconds per call (this process and the server)."""
    server = subprocess.Popen(
        [sys.executable, _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    assert server.stdin is not None and server.stdout is not None
    times, before = [], 0.0
    try:
        for i in range(n + 5):
            if i == 5:
                before = time.process_time() + procs.cpu_time(server.pid, reaped=False)
            request = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "x"}},
            }
            t = time.perf_counter()
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdout.readline()
            if i >= 5:
                times.append(time.perf_counter() - t)
        cpu = time.process_time() + procs.cpu_time(server.pid, reaped=False) - before
    finally:
        server.stdin.close()
        server.wait()
        server.stdout.close()
    return times, cpu / n


async def mcp_round_trips(n: int) -> tuple[list[float], float] | str:
    """An MCP ``echo`` call through andon: the same server under a worker's containment, the
    official SDK's client over the host's socket (docs/tools.md, MCP servers); the round trips
    and the CPU seconds per call of andon's side (supervisor and worker, not the server). A
    reason instead where the SDK is not installed."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return "the MCP SDK is not installed (pip install 'andon[mcp]')"
    from andon.mcp import MCP_HOST, McpServer, McpServerConfig

    registry = ToolRegistry([MCP_HOST])
    async with WorkerPool(WorkerPoolConfig(size=1), registry) as pool:
        executor = ToolExecutor(pool, registry)
        server = McpServer(McpServerConfig("bench", (sys.executable, _ECHO)), executor)
        async with server:
            await server.start()
            times, before = [], 0.0
            for i in range(n + 5):
                if i == 5:
                    before = pool_cpu(pool)
                t = time.perf_counter()
                await server.call("echo", {"text": "x"}, AbortController().signal)
                if i >= 5:
                    times.append(time.perf_counter() - t)
            return times, (pool_cpu(pool) - before) / n


async def run_dispatch(runs: int, progress: Any) -> tuple[dict[str, Any], str]:
    from ._tools import noop

    registry = default()
    registry.add(noop)
    n = runs * 10
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        progress("dispatch", 0, 4)
        raw, raw_cpu = await raw_zmq_round_trips(n, tmp)
        forks, fork_cpu = _timed_forks(n)
        fsync_path = os.path.join(tmp, "fsync")
        before = own_cpu()
        fsyncs = [_floors.fsync_once(fsync_path) for _ in range(n)]
        fsync_cpu = (own_cpu() - before) / n
        async with WorkerPool(WorkerPoolConfig(size=1), registry) as pool:
            await pool.wait_started()  # its start-up is not a call's CPU time
            executor = ToolExecutor(pool, registry, session_dir=Path(tmp))
            progress("dispatch", 1, 4)
            noop_rt, noop_cpu = await _dispatch(
                pool, executor, lambda i: ToolCallRequest(f"c9-1-{i + 1}", "noop", "{}", tmp), n
            )
            bash_rt, bash_cpu = await _dispatch(
                pool,
                executor,
                lambda i: ToolCallRequest(f"c8-1-{i + 1}", "bash", '{"command": "true"}', tmp),
                n,
            )
        progress("dispatch", 2, 4)
        spawn = []
        before = own_cpu()
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            spawn.append(time.perf_counter() - t)
        spawn_cpu = (own_cpu() - before) / n
        progress("dispatch", 3, 4)
        measured = {size: await _throughput(registry, size, n, tmp) for size in (1, 2, 4)}
        mcp_bare = bare_mcp_round_trips(n)
        mcp_found = await mcp_round_trips(n)
    rates = {size: rate for size, (rate, _) in measured.items()}
    cpu = {
        "raw zmq.asyncio round trip (floor)": raw_cpu,
        "fork + wait of a warm Python (floor)": fork_cpu,
        "raw round trip + fork (floor sum)": raw_cpu + fork_cpu,
        "raw zmq round trip + one fsync": raw_cpu + fsync_cpu,
        "no-op Python tool through the pool": noop_cpu,
        "bash -c true through the pool": bash_cpu,
        "subprocess.run(['true'])": spawn_cpu,
    }
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
        "MCP echo: the server's own round trip (floor)": summary(mcp_bare[0]),
    }
    cpu["MCP echo: the server's own round trip (floor)"] = mcp_bare[1]
    if not isinstance(mcp_found, str):
        rows["MCP echo call through andon"] = summary(mcp_found[0])
        cpu["MCP echo call through andon"] = mcp_found[1]
    noop_p50 = rows["no-op Python tool through the pool"]["p50"]
    ratio = noop_p50 / rows["raw zmq.asyncio round trip (floor)"]["p50"]
    floor_sum = (
        rows["raw zmq.asyncio round trip (floor)"]["p50"]
        + rows["fork + wait of a warm Python (floor)"]["p50"]
    )
    for name, row in rows.items():
        row["cpu"] = cpu[name]
    data: dict[str, Any] = {
        "round_trip": rows,
        "noop_ratio_p50": ratio,
        "noop_vs_floor_sum_p50": noop_p50 / floor_sum,
        "noop_cpu_per_call": noop_cpu,
        "calls_per_second": {str(k): v for k, v in rates.items()},
        "cpu_per_call_by_workers": {str(k): c for k, (_, c) in measured.items()},
        "mcp": mcp_found if isinstance(mcp_found, str) else "measured",
    }
    text = "\n".join(
        [
            f"dispatch round trip (ms), {n} calls each; cpu: CPU time per call, every process",
            table(
                ["path", "p50", "p95", "p99", "max", "cpu"],
                [
                    [k, ms(s["p50"]), ms(s["p95"]), ms(s["p99"]), ms(s["max"]), ms(s["cpu"])]
                    for k, s in rows.items()
                ],
            ),
            f"no-op / (raw round trip + fork) at p50: {noop_p50 / floor_sum:.2f}x (goal <= 2x); "
            f"no-op / raw round trip alone: {ratio:.2f}x; "
            f"no-op CPU per call: {ms(noop_cpu)} ms (goal <= 2 ms)",
            "no-op calls/second: "
            + ", ".join(
                f"{k} worker(s) {rate:.0f} ({ms(c)} ms CPU per call)"
                for k, (rate, c) in measured.items()
            ),
            _mcp_line(rows, mcp_found),
        ]
    )
    return data, text


def _mcp_line(rows: dict[str, Any], found: Any) -> str:
    if isinstance(found, str):
        return f"MCP: not measured: {found}"
    through = rows["MCP echo call through andon"]["p50"]
    bare = rows["MCP echo: the server's own round trip (floor)"]["p50"]
    bash = rows["bash -c true through the pool"]["p50"]
    return (
        f"MCP echo through andon at p50: {ms(through)} ms, {through / bare:.1f}x the server's own "
        f"round trip, +{ms(through - bare)} ms over it; a bash call: {ms(bash)} ms (cpu: andon's "
        "side only, the server's own CPU is not in it)"
    )
