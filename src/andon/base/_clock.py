"""Time through an injected clock.

Grace periods, heartbeats, budgets and backoff read a :class:`Clock`, so the SIGKILL escalation test
can run in milliseconds on a :class:`ManualClock` instead of sleeping through real seconds.

There is one timer primitive, :meth:`Clock.call_at`: run a plain callback at a point on the
clock's monotonic scale. Every "wait until then, then poke something" in andon is a ``call_at``,
never a task that sleeps: a timer has no task to own, await or leak, and cancelling it is
synchronous.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "Timer"]


@runtime_checkable
class Timer(Protocol):
    """A pending :meth:`Clock.call_at`; ``cancel()`` is idempotent and safe after it fired."""

    def cancel(self) -> None: ...


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

    def call_at(self, when: float, fn: Callable[[], object]) -> Timer:
        """Call ``fn()`` on the running loop once ``monotonic() >= when`` (at once if it already
        is, but never synchronously inside ``call_at``). ``when = inf`` never fires."""
        ...


class _Never:
    def cancel(self) -> None:
        pass


class SystemClock:
    """The real clock; timers are the running loop's own."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        if math.isinf(seconds):
            await asyncio.get_running_loop().create_future()  # until cancelled
        await asyncio.sleep(max(0.0, seconds))

    def call_at(self, when: float, fn: Callable[[], object]) -> Timer:
        if math.isinf(when):
            return _Never()
        # call_later, not the loop's call_at: the loop's time scale need not be time.monotonic.
        return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), fn)


class _ManualTimer:
    __slots__ = ("cancelled", "fired", "fn", "when")

    def __init__(self, when: float, fn: Callable[[], object]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self.cancelled = True

    @property
    def pending(self) -> bool:
        return not (self.cancelled or self.fired)


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance`.

    Sleeps and timers share one heap. ``wait_for_sleepers(n)`` lets a test wait (on an event, not a
    sleep) until ``n`` sleeps or timers are pending before it advances time past their deadlines.
    A timer whose time has come runs on the loop (``call_soon``), as a real timer would, never
    inside ``advance()``.
    """

    def __init__(self, start: float = 1000.0, wall_start: float = 1_764_661_200.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._counter = itertools.count()
        self._changed: asyncio.Event | None = None

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    @property
    def sleepers(self) -> int:
        """How many sleeps and timers are pending right now."""
        return sum(1 for _, _, timer in self._timers if timer.pending)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_at(self._now + seconds, wake)
        try:
            await fut
        finally:
            timer.cancel()

    def call_at(self, when: float, fn: Callable[[], object]) -> Timer:
        loop = asyncio.get_running_loop()
        if math.isinf(when):
            timer = _ManualTimer(when, fn)
            heapq.heappush(self._timers, (when, next(self._counter), timer))
            self._notify()
            return timer
        timer = _ManualTimer(when, fn)
        if when <= self._now:
            loop.call_soon(self._fire, timer)
        else:
            heapq.heappush(self._timers, (when, next(self._counter), timer))
        self._notify()
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward; every timer whose deadline has passed runs on the loop, in order."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        due: list[_ManualTimer] = []
        while self._timers and self._timers[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._timers)
            if timer.pending:
                due.append(timer)
        if due:
            loop = asyncio.get_running_loop()
            for timer in due:
                loop.call_soon(self._fire, timer)
        self._notify()

    @staticmethod
    def _fire(timer: _ManualTimer) -> None:
        if timer.pending:
            timer.fired = True
            timer.fn()

    async def wait_for_sleepers(self, n: int = 1) -> None:
        """Return once at least ``n`` sleeps or timers are pending."""
        while self.sleepers < n:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
