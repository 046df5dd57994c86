"""The worker's one reaper.

Every child exit in a worker is collected here, with ``os.waitid(P_ALL, 0, WEXITED | WNOHANG)``,
woken by SIGCHLD. It records the tool leader's status and reaps the orphans the worker adopts as a
subreaper. Nothing else in the worker may wait for a child: a second waiter could steal a status,
and a stolen status reads as exit 0, turning a failed build into a success.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass

__all__ = ["Reaper", "WaitStatus"]


@dataclass(frozen=True, slots=True)
class WaitStatus:
    code: int | None  # exit code, if it exited
    signal: int | None  # signal number, if a signal ended it

    @classmethod
    def from_waitid(cls, result: os.waitid_result) -> WaitStatus:
        if result.si_code == os.CLD_EXITED:
            return cls(code=result.si_status, signal=None)
        return cls(code=None, signal=result.si_status)


class Reaper:
    """Collects child exits; ``await reaper.wait(pid)`` returns that child's status."""

    def __init__(self) -> None:
        self._statuses: dict[int, WaitStatus] = {}
        self._waiters: dict[int, asyncio.Future[WaitStatus]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.generation = 0  # counts reaps; bumps wake ``wait_change``
        self._changed: asyncio.Event | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def uninstall(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
            self._loop = None

    def watch(self, pid: int) -> None:
        """Keep ``pid``'s status when it exits (call right after starting it)."""
        if pid not in self._waiters and pid not in self._statuses:
            self._waiters[pid] = asyncio.get_running_loop().create_future()
        self.reap()  # it may already have exited before we looked

    def forget(self, pid: int) -> None:
        """Stop keeping ``pid``'s status (a spare call process given up on): if it is still
        running, its exit is reaped like a stray's."""
        fut = self._waiters.pop(pid, None)
        if fut is not None:
            fut.cancel()
        self._statuses.pop(pid, None)

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is a watched child not yet reaped. Until it is reaped its pid, and a
        process group it leads, cannot be reused: only then may a bare number be signalled."""
        return pid in self._waiters

    async def wait(self, pid: int) -> WaitStatus:
        if pid not in self._statuses and pid not in self._waiters:
            self.watch(pid)
        if pid in self._statuses:
            return self._statuses.pop(pid)
        status = await self._waiters[pid]
        self._statuses.pop(pid, None)
        return status

    async def wait_change(self, since: int, timeout: float) -> None:
        """Return once a child has been reaped after generation ``since``, or after ``timeout``."""
        if self.generation != since:
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def reap(self) -> int:
        """Reap every child that has exited; return how many."""
        count = self._reap()
        if count:
            self.generation += 1
            if self._changed is not None:
                self._changed.set()
                self._changed = None
        return count

    def _reap(self) -> int:
        count = 0
        while True:
            try:
                result = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                return count
            if result is None or result.si_pid == 0:
                return count
            count += 1
            pid = result.si_pid
            fut = self._waiters.pop(pid, None)
            if fut is None:
                continue  # an adopted orphan or a stray: reaped, nothing more to do
            status = WaitStatus.from_waitid(result)
            self._statuses[pid] = status
            if not fut.done():
                fut.set_result(status)
