"""The worker pool's lifecycle as one value (docs/workers.md, The pool's life).

The pool holds one :class:`PoolState`, replaced whole at each step, instead of flags that could
disagree; what it opened on the way up is held by its exit stack, not here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["POOL_CLOSED", "Phase", "PoolState"]

POOL_CLOSED = "the worker pool was closed"
"""Why a closed pool's calls end: the reason of their ``WorkerGone``, and of ``acquire``'s error."""


class Phase(enum.Enum):
    """Where a pool is in its life (docs/workers.md, The pool's life)."""

    NEW = "new"  # made: nothing is open yet
    STARTING = "starting"  # start() opens what the pool runs on and waits for its first worker
    OPEN = "open"  # start() returned: workers are lent, and replaced when they end
    STOPPED = "stopped"  # no more work (its starts gave up, or its receiver failed); open still
    CLOSING = "closing"  # aclose() ends the workers, then unwinds what start() opened
    CLOSED = "closed"  # nothing of it is left


_TAKING_WORK = frozenset({Phase.NEW, Phase.STARTING, Phase.OPEN})


@dataclass(frozen=True)
class PoolState:
    """The pool's lifecycle as one value: its phase and, once it takes no more work, why (the
    reason every later or waiting call gets, and the reason of its ``WorkerGone``)."""

    phase: Phase = Phase.NEW
    stopped: str | None = None

    def __post_init__(self) -> None:
        assert (self.stopped is None) == (self.phase in _TAKING_WORK), self

    @property
    def closes(self) -> bool:
        """aclose() was called: it runs, or it is over."""
        return self.phase in (Phase.CLOSING, Phase.CLOSED)

    def opened(self) -> PoolState:
        """start() returned: open, unless it stopped taking work meanwhile."""
        return PoolState(Phase.OPEN) if self.phase is Phase.STARTING else self

    def stop(self, reason: str) -> PoolState:
        """No more work, for ``reason``: the first reason given is the one that stays."""
        return self if self.stopped is not None else PoolState(Phase.STOPPED, reason)

    def closing(self) -> PoolState:
        return PoolState(Phase.CLOSING, self.stopped or POOL_CLOSED)

    def closed(self) -> PoolState:
        return PoolState(Phase.CLOSED, self.stopped or POOL_CLOSED)
