"""Time through an injected clock.

Grace periods, heartbeats and backoff read a :class:`Clock`, so the SIGKILL escalation test can run
in milliseconds on a :class:`ManualClock` instead of sleeping through real seconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    def time(self) -> float:
        """Unix seconds, for records."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` on this clock (``inf`` sleeps until cancelled)."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        if math.isinf(seconds):
            await asyncio.get_running_loop().create_future()  # until cancelled
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance`.

    ``wait_for_sleepers(n)`` lets a test wait (on an event, not a sleep) until ``n`` tasks are
    sleeping on the clock before it advances time past their deadlines.
    """

    def __init__(self, start: float = 1000.0, wall_start: float = 1_764_661_200.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()
        self._changed: asyncio.Event | None = None

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending right now."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._counter), fut))
        self._notify()
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
        self._notify()

    async def wait_for_sleepers(self, n: int = 1) -> None:
        """Return once at least ``n`` sleeps are pending."""
        while self.sleepers < n:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
