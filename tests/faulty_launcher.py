"""Local workers that break the protocol on purpose: the test seam of the worker pool.

``WorkerPool(config, registry, launcher=FaultyLauncher(...))`` starts forks of the forkserver
that run a faulty worker (tests/faulty_workers.py) instead of andon's own; the pool and its
config know nothing of it (docs/workers.md, Faults on purpose).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from andon.base import ContainmentSetting
from andon.fleet import ForkserverLauncher, LaunchedWorker, WorkerSpec
from andon.workers import Worker, WorkerOptions, worker_main

__all__ = ["FaultyLauncher"]


class FaultyLauncher(ForkserverLauncher):
    """Local workers, the n-th of which serves ``faults[n]`` (past the list: ``then``); None is
    andon's own worker, without a fault."""

    def __init__(
        self,
        faults: list[type[Worker] | None],
        then: type[Worker] | None = None,
        containment: ContainmentSetting = "subreaper",
    ) -> None:
        super().__init__(containment)
        self.faults = faults
        self.then = then
        self.started: list[LaunchedWorker] = []
        self._programs = 0  # programs handed out: the next start's index

    def worker_program(self) -> Callable[[WorkerOptions], object]:
        n, self._programs = self._programs, self._programs + 1
        fault = self.faults[n] if n < len(self.faults) else self.then
        if fault is None:
            return worker_main
        return functools.partial(worker_main, worker_class=fault)

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        launched = await super().start(spec)
        self.started.append(launched)
        return launched
