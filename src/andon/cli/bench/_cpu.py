"""CPU time beside wall time: what a measured stretch cost the machine, a figure that stays
comparable on a loaded machine where latencies do not (docs/benchmarks.md, CPU time)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from andon import procs

__all__ = ["CpuMeter"]


class CpuMeter:
    """CPU of this process (every thread) plus that of other processes' threads (never what
    they reaped), between :meth:`start` and :meth:`stop`. A process gone by the stop counts
    nothing (its last moments are not readable): the benchmarks measure long-lived workers,
    never the tool."""

    def __init__(self) -> None:
        self._own = 0.0
        self._others: dict[int, float] = {}

    def start(self, pids: Iterable[int] = ()) -> None:
        self._own = time.process_time()  # every thread, in ns (os.times() counts ticks)
        # A process already gone reads 0.0: left out, so that its pid, reused, counts nothing.
        self._others = {p: t for p in pids if (t := procs.cpu_time(p, reaped=False)) > 0}

    def stop(self) -> float:
        spent = time.process_time() - self._own
        for pid, before in self._others.items():
            spent += max(0.0, procs.cpu_time(pid, reaped=False) - before)
        return spent
