"""CPU time beside wall time: what a measured stretch cost the machine, a figure that stays
comparable on a loaded machine where latencies do not (docs/benchmarks.md, CPU time)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

__all__ = ["CpuMeter", "threads_cpu"]


def threads_cpu(pid: int) -> float | None:
    """Seconds of CPU the live threads of ``pid`` have run (``/proc/PID/task/*/schedstat``,
    nanoseconds, so a stop of a few milliseconds is not lost in clock ticks); ``None`` if the
    process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return total / 1e9


class CpuMeter:
    """CPU of this process (every thread) plus that of other processes' live threads, between
    :meth:`start` and :meth:`stop`. A process gone by the stop counts nothing (its last moments
    are not readable): the benchmarks measure long-lived workers, never the tool."""

    def __init__(self) -> None:
        self._own = 0.0
        self._others: dict[int, float] = {}

    def start(self, pids: Iterable[int] = ()) -> None:
        self._own = time.process_time()  # every thread, in ns (os.times() counts ticks)
        self._others = {}
        for pid in pids:
            cpu = threads_cpu(pid)
            if cpu is not None:
                self._others[pid] = cpu

    def stop(self) -> float:
        spent = time.process_time() - self._own
        for pid, before in self._others.items():
            after = threads_cpu(pid)
            if after is not None:
                spent += max(0.0, after - before)
        return spent
