"""Python tools in call processes: trial counts for what the suite checks a few dozen times.

    python benchmarks/bench_call_process.py [--trials 1000]

* exit statuses: a Python tool runs ``subprocess.run`` (plain and ``capture_output``) and an
  asyncio subprocess, each exiting 3, ``--trials`` times per containment mode; every status must
  read 3 (a stolen status reads 0 or 255). Prints the count of each reading per mode.
* dispatch: the same calls' round trip, p50 and p99 per mode, beside a bare fork-and-wait of this
  (warm) Python process measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.workers.pytools import more_tools

from andon.base import AbortController
from andon.cli.bench._dispatch import fork_and_wait
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.workers import detect_mode


def _modes() -> list[str]:
    modes = []
    for mode in ("cgroup", "subreaper", "pgroup"):
        try:
            detect_mode(mode)
        except ValueError:
            continue
        modes.append(mode)
    return modes


async def _statuses(mode: str, trials: int) -> tuple[collections.Counter[str], list[float]]:
    registry = more_tools()
    config = WorkerPoolConfig(size=1, containment=mode)  # type: ignore[arg-type]
    seen: collections.Counter[str] = collections.Counter()
    times = []
    async with WorkerPool(config, registry) as pool:
        executor = ToolExecutor(pool, registry)
        for n in range(trials):
            request = ToolCallRequest(f"c1-{n + 1}-1", "exit_statuses", "{}", os.getcwd())
            t = time.perf_counter()
            outcome = await executor.execute(request, AbortController().signal)
            times.append(time.perf_counter() - t)
            seen[outcome.content] += 1
    return seen, sorted(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    args = parser.parse_args()
    forks = sorted(fork_and_wait(200))
    print(f"fork + wait of a warm Python (floor): p50 {forks[100] * 1e3:.2f} ms")
    bad = 0
    for mode in _modes():
        seen, times = asyncio.run(_statuses(mode, args.trials))
        p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
        readings = ", ".join(f"{k!r}×{v}" for k, v in seen.most_common())
        print(f"{mode:10} {readings}   round trip p50 {p50 * 1e3:.1f} ms p99 {p99 * 1e3:.1f} ms")
        bad += sum(v for k, v in seen.items() if k != "3,3,3")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
