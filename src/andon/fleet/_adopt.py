"""Workers started by hand on other hosts, adopted by the pool (``andon run --workers-in
tcp:LISTEN``; docs/scale-out.md, Workers started by hand).

Nothing is launched: the pool listens on tcp + CURVE, and a worker whose key is on the allowed
list dials in with an id of its own (``andon worker --connect tcp://… --id build-1 --keys …``).
Its hello is an *arrival*; each start of the pool takes the next one (waiting at most ``wait``
seconds for it), so a pool of size N adopts up to N such workers, and a lost one is replaced by
the next that arrives. The worker process is not andon's: the pool never signals it. It stops its
own call when told (``shutdown``) or when it stops hearing the pool (the heartbeat deadline), as
every worker elsewhere does.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import final
from urllib.parse import urlsplit

from andon.base import WorkerError
from andon.fleet._launch import LaunchedWorker, WorkerLauncher, WorkerSpec
from andon.protocol import Hello, is_every_address, key_to_hex

__all__ = ["AdoptLauncher", "AdoptedWorker", "Arrival"]


@final
@dataclass(frozen=True)
class Arrival:
    """A hello from a worker the pool did not start, under a key it allows."""

    worker_id: str
    hello: Hello
    key: bytes | None


class AdoptedWorker(LaunchedWorker):
    """A worker started by hand, as the pool holds it: no pid of this machine, and no end the
    pool can see (its ``exit`` resolves when the pool lets go of it or loses it)."""

    def __init__(self, arrival: Arrival) -> None:
        super().__init__(arrival.worker_id)
        self.arrival = arrival

    def describe(self) -> str:
        return f"worker {self.worker_id} (started by hand on {self.arrival.hello.host})"


@final
class AdoptLauncher(WorkerLauncher):
    """Adopts workers started by hand, instead of starting any: ``start`` waits for the next
    arrival, ``kill`` and ``stop`` let go of a worker (the pool tells it to shut down; the
    worker, which is not andon's process, stops its own call and exits)."""

    transport = "tcp"
    heartbeats = True
    local_processes = False
    adopts = True
    lost_call_note = "the worker stops the call's processes itself when it loses andon"

    def __init__(self, *, wait: float, on_waiting: Callable[[str], None] | None = None) -> None:
        if not wait > 0:
            raise ValueError("wait must be a number of seconds, above 0")
        self.wait = wait
        self.on_waiting = on_waiting
        """Told how to start a worker (the command line, with the bound port and this pool's
        key) each time a start has to wait for one: a CLI prints it."""
        self._arrivals: deque[Arrival] = deque()
        self._waiters: deque[asyncio.Future[Arrival]] = deque()

    def offer(self, arrival: Arrival) -> str | None:
        """A worker the pool does not know said hello: handed to a start waiting for one, or
        kept for the next (the pool keeps no more than its size wants), or refused with the
        reason for its ``refused``."""
        if any(a.worker_id == arrival.worker_id for a in self._arrivals):
            return f"a worker with the id {arrival.worker_id!r} is already waiting to be adopted"
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(arrival)
                return None
        self._arrivals.append(arrival)
        return None

    def forget(self, worker_id: str) -> None:
        """A kept arrival is no longer wanted (the pool closes, or it said something else)."""
        self._arrivals = deque(a for a in self._arrivals if a.worker_id != worker_id)

    @property
    def waiting(self) -> int:
        """Arrivals kept, not adopted yet."""
        return len(self._arrivals)

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        if self._arrivals:
            return AdoptedWorker(self._arrivals.popleft())
        how = how_to_start(spec)
        if self.on_waiting is not None:
            self.on_waiting(how)
        waiter: asyncio.Future[Arrival] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        adopted = False
        try:
            arrival = await asyncio.wait_for(asyncio.shield(waiter), self.wait)
            adopted = True
        except TimeoutError:
            raise WorkerError(
                f"no worker connected to {spec.endpoint} within {self.wait:g}s: start one "
                f"with {how}"
            ) from None
        finally:
            if adopted:
                pass
            elif waiter.done() and not waiter.cancelled():
                # Handed over just as this start gave up (or was cancelled): kept for the next.
                self._arrivals.appendleft(waiter.result())
            else:
                waiter.cancel()
        return AdoptedWorker(arrival)

    def kill(self, worker: LaunchedWorker) -> None:
        worker._set_exited()

    async def stop(self, worker: LaunchedWorker, timeout: float) -> None:
        worker._set_exited()


def how_to_start(spec: WorkerSpec) -> str:
    """The command line that starts a worker this pool adopts (on the worker's host; a bound
    wildcard address stands for whichever of this host's addresses that host reaches)."""
    endpoint = spec.endpoint
    parts = urlsplit(endpoint)
    if is_every_address(parts.hostname or ""):
        endpoint = f"tcp://THIS-HOST:{parts.port}"
    key = f" --server-key={key_to_hex(spec.server_key)}" if spec.server_key else " --insecure"
    return (
        f"andon worker --connect {endpoint}{key} --keys WORKER.key_secret --id NAME "
        f"(its public key among the allowed keys)"
    )
