"""What a worker pool lets its owner see: an observer told of each event as it happens, and a
snapshot of its counters (``WorkerPool(..., observer=...)``, ``pool.statistics()``).

Both exist so that a caller (a test, a dashboard, a benchmark) waits on an event or reads a figure
without reaching into the pool: the pool itself never reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import final

__all__ = ["PoolObserver", "PoolStatistics"]


class PoolObserver:
    """Subclass and override what you need; every method is a no-op here.

    Called on the pool's own task, synchronously: keep them short and never raise (an exception
    is logged and dropped, the pool goes on)."""

    def on_broken(self, worker_id: str, reason: str) -> None:
        """A worker is being killed or was lost for a reason of its own (a bad frame, silence,
        an exit), not because the pool was told to kill it."""

    def on_adopted(self, worker_id: str, host: str) -> None:
        """A worker started by hand on ``host`` was taken into the pool (``AdoptLauncher``)."""

    def on_refused(self, reason: str) -> None:
        """A worker was turned away (at the CURVE handshake, or at its hello: a stranger, a full
        pool), a client failed the handshake, or a frame was dropped because it came under
        another worker's key (tcp)."""


@final
@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """The pool's counters at one moment."""

    workers: Mapping[str, int]
    """Worker id -> pid of every live worker."""
    spoofed: int
    """Frames dropped since the start: sent under another worker's key (tcp + CURVE)."""
    error_replies: tuple[tuple[str, str], ...]
    """(worker id, reason) of each error a worker answered outside any call, oldest first."""
    failed_starts: int = 0
    """Worker starts that failed since the pool started (each attempt counts: a missed hello
    deadline, an exit before the hello, a launcher's error)."""
