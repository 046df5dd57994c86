"""Worker benchmarks: dispatch round trip and cancel -> result latency, each beside its floor.

    python benchmarks/bench_workers.py [--runs 20] [--json]

Every figure is measured in the same run as its floor, and reported as a ratio or an overhead:

* dispatch: a no-op Python tool and ``bash -c true`` through the pool, beside a raw zmq.asyncio
  round trip to another process and ``subprocess.run(['true'])``.
* cancel -> result for ``shell`` (sleep, ends on SIGINT), ``trap-int`` (ends on SIGTERM),
  ``stubborn`` (only SIGKILL) and ``tree`` (50 processes, escapees, a daemon), beside a bare script
  that signals and reaps the same tree with no andon in between.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from _stats import summary, table
from andon.base import AbortController, GracePolicy, User
from andon.cli.bench import _floors
from andon.supervisor import (
    ExecutionObserver,
    ToolCallRequest,
    ToolExecutor,
    WorkerPool,
    WorkerPoolConfig,
)
from andon.testing import SHELL_SLEEP, STUBBORN, TRAP_INT, benchmark_tree
from andon.workers import default, tool

GRACE = GracePolicy(term_after=0.2, kill_after=0.3)


@tool(parallel_safe=True)
def noop() -> str:
    return ""


class _Ready(ExecutionObserver):
    def __init__(self) -> None:
        self.seen = bytearray()
        self.ready = asyncio.Event()

    def on_output(self, call_id: str, data: bytes) -> None:
        self.seen += data
        if b"ready" in self.seen:
            self.ready.set()


# -- floors -------------------------------------------------------------------------------------

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


async def raw_zmq_round_trips(n: int) -> list[float]:
    folder = tempfile.mkdtemp(prefix="andon-bench-")
    endpoint = f"ipc://{folder}/echo.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER, endpoint], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    server.stdout.readline()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    payload = [b"h" * 40, b"p" * 200]  # about the size of a small run/result frame
    times = []
    for i in range(n + 5):
        t = time.perf_counter()
        await sock.send_multipart(payload)
        await sock.recv_multipart()
        if i >= 5:
            times.append(time.perf_counter() - t)
    await sock.send_multipart([b"stop"])
    sock.close(0)
    ctx.term()
    server.wait()
    os.rmdir(folder) if not os.listdir(folder) else None
    return times


def subprocess_true(n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(["true"], check=True)
        times.append(time.perf_counter() - t)
    return times


def bare_stop(command: str, signals: list[tuple[int, float]]) -> tuple[float, int]:
    """The bare floor (killpg + reap of the leader). What it leaves is found by a tag of this
    run's own, never by command line: another benchmark or test suite may run the same
    commands beside this one."""
    return _floors.bare_stop(command, signals, secrets.token_hex(8))


def bare_stop_everything(command: str) -> float:
    """The fair floor for a tree: what andon does (SIGINT to the group, reap the leader, SIGTERM
    to every process left, including escapees, and wait until all are gone)."""
    return _floors.bare_stop_everything(command, secrets.token_hex(8))


# -- andon --------------------------------------------------------------------------------------


async def andon_stops(executor: ToolExecutor, command: str, n: int) -> list[float]:
    times = []
    for i in range(n):
        controller = AbortController()
        ready = _Ready()
        request = ToolCallRequest(
            f"c1-1-{i + 1}", "bash", json.dumps({"command": command}), os.getcwd()
        )
        task = asyncio.create_task(executor.execute(request, controller.signal, ready))
        await ready.ready.wait()
        t = time.perf_counter()
        controller.abort(User())
        await task
        times.append(time.perf_counter() - t)
    return times


async def dispatch(
    executor: ToolExecutor, request: Callable[[int], ToolCallRequest], n: int
) -> list[float]:
    times = []
    for i in range(n + 5):
        t = time.perf_counter()
        await executor.execute(request(i), AbortController().signal)
        if i >= 5:
            times.append(time.perf_counter() - t)
    return times


def ms(value: float) -> str:
    return f"{value * 1000:.2f}"


async def main(runs: int, as_json: bool, containment: str = "auto") -> dict[str, Any]:
    registry = default()
    registry.add(noop)
    results: dict[str, Any] = {"runs": runs, "grace": GRACE.to_dict()}
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        config = WorkerPoolConfig(size=1, containment=containment)  # type: ignore[arg-type]
        async with WorkerPool(config, registry) as pool:
            results["containment"] = pool.containment
            executor = ToolExecutor(pool, registry, grace=GRACE, session_dir=Path(tmp))
            n_dispatch = runs * 10
            raw = summary(await raw_zmq_round_trips(n_dispatch))
            noop_rt = summary(
                await dispatch(
                    executor,
                    lambda i: ToolCallRequest(f"c9-1-{i + 1}", "noop", "{}", tmp),
                    n_dispatch,
                )
            )
            bash_rt = summary(
                await dispatch(
                    executor,
                    lambda i: ToolCallRequest(f"c8-1-{i + 1}", "bash", '{"command": "true"}', tmp),
                    n_dispatch,
                )
            )
            spawn = summary(subprocess_true(n_dispatch))
            results["dispatch"] = {
                "raw_zmq_asyncio_round_trip": raw,
                "noop_tool_through_pool": noop_rt,
                "bash_true_through_pool": bash_rt,
                "subprocess_run_true": spawn,
                "noop_ratio_p50": noop_rt["p50"] / raw["p50"],
            }
            tick_file = os.path.join(tmp, "ticks")
            scenarios = {
                "shell": (SHELL_SLEEP, [(signal.SIGINT, 0.0)], 0.0),
                "trap-int": (
                    TRAP_INT,
                    [(signal.SIGINT, 0.0), (signal.SIGTERM, GRACE.term_after)],
                    GRACE.term_after,
                ),
                "stubborn": (
                    STUBBORN,
                    [
                        (signal.SIGINT, 0.0),
                        (signal.SIGTERM, GRACE.term_after),
                        (signal.SIGKILL, GRACE.kill_at),
                    ],
                    GRACE.kill_at,
                ),
                "tree": (benchmark_tree(tick_file), [(signal.SIGINT, 0.0)], 0.0),
            }
            stops: dict[str, Any] = {}
            for name, (command, sigs, stage_at) in scenarios.items():
                andon = await andon_stops(executor, command, runs)
                floors, escaped = [], []
                for _ in range(runs):
                    if os.path.exists(tick_file):
                        os.unlink(tick_file)
                    took, left = await asyncio.to_thread(bare_stop, command, sigs)
                    floors.append(took)
                    escaped.append(left)
                if os.path.exists(tick_file):
                    os.unlink(tick_file)
                a, f = summary(andon), summary(floors)
                if name == "tree":
                    everything = []
                    for _ in range(runs):
                        everything.append(await asyncio.to_thread(bare_stop_everything, command))
                        if os.path.exists(tick_file):
                            os.unlink(tick_file)
                    stops["tree (floor: stop everything)"] = {
                        "andon": a,
                        "floor": summary(everything),
                        "stage_at": 0.0,
                        "overhead_p50": a["p50"] - summary(everything)["p50"],
                        "overhead_p99": a["p99"] - summary(everything)["p99"],
                        "floor_leftovers_max": 0,
                    }
                stops[name] = {
                    "andon": a,
                    "floor": f,
                    "stage_at": stage_at,
                    "overhead_p50": a["p50"] - f["p50"],
                    "overhead_p99": a["p99"] - f["p99"],
                    "floor_leftovers_max": max(escaped),
                }
            results["cancel_to_result"] = stops
    if as_json:
        print(json.dumps(results, indent=2))
        return results
    d = results["dispatch"]
    print(
        f"containment: {results['containment']}; runs: {runs}; "
        f"grace {GRACE.term_after},{GRACE.kill_after}\n"
    )
    print("dispatch round trip (ms)")
    print(
        table(
            ["path", "p50", "p95", "p99", "max"],
            [
                [label, ms(s["p50"]), ms(s["p95"]), ms(s["p99"]), ms(s["max"])]
                for label, s in (
                    ("raw zmq.asyncio round trip (floor)", d["raw_zmq_asyncio_round_trip"]),
                    ("no-op Python tool through the pool", d["noop_tool_through_pool"]),
                    ("bash -c true through the pool", d["bash_true_through_pool"]),
                    ("subprocess.run(['true'])", d["subprocess_run_true"]),
                )
            ],
        )
    )
    print(f"no-op / raw at p50: {d['noop_ratio_p50']:.2f}x (goal <= 3x)\n")
    print("cancel -> result (ms); floor = the same tree signalled and reaped by a bare script")
    rows = []
    for name, s in results["cancel_to_result"].items():
        rows.append(
            [
                name,
                ms(s["andon"]["p50"]),
                ms(s["andon"]["p99"]),
                ms(s["floor"]["p50"]),
                ms(s["floor"]["p99"]),
                ms(s["overhead_p50"]),
                ms(s["overhead_p99"]),
                s["floor_leftovers_max"],
            ]
        )
    print(
        table(
            [
                "scenario",
                "andon p50",
                "andon p99",
                "floor p50",
                "floor p99",
                "+p50",
                "+p99",
                "floor leaves",
            ],
            rows,
        )
    )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--containment", default="auto", choices=["auto", "cgroup", "subreaper", "pgroup"]
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.json, args.containment))
