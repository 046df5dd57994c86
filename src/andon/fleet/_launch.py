"""The launcher seam: how the pool starts, watches and ends its workers (docs/scale-out.md, The
launcher seam).

The pool owns one ROUTER socket, the protocol and the leases; a launcher owns the processes. A
worker is always the same program speaking the same protocol, wherever it runs: a fork of the
local forkserver (:class:`ForkserverLauncher`), a container's main process
(:class:`ContainerLauncher`), or a command such as ``ssh HOST andon worker --connect …``
(:class:`CommandLauncher`). So local and launched workers share one pool and one grace timeline:
the executor sends the stages, the worker signals its own call's group, and the launcher's
``kill`` is only the backstop for a worker that is lost or disposed of.

A launcher says how its workers' liveness is known. Local workers are watched through pidfds, so a
busy event loop never makes one look dead; everywhere else the pool and the worker exchange
heartbeats, and silence past the deadline is a loss on both sides.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, final

from andon import procs
from andon.base import Containment
from andon.protocol import CurveKeys, Started, key_to_hex
from andon.workers import ToolRegistry

__all__ = [
    "LaunchedWorker",
    "PidfdWorker",
    "PoolSetup",
    "WorkerLauncher",
    "WorkerSpec",
    "server_key_argument",
    "worker_argv",
]

Transport = Literal["ipc", "tcp"]


@final
@dataclass(frozen=True)
class PoolSetup:
    """What a pool tells its launcher once, before the first worker starts."""

    runtime_dir: Path
    """The pool's private 0700 folder: the ``ipc://`` socket and the workers' logs live here."""
    registry: ToolRegistry
    """The tools the workers must offer (supervisor tools left out)."""
    hidden_env: frozenset[str]
    """Variables no worker may hold (the model API keys)."""
    max_message_bytes: int
    identity: str
    """Unique to this pool on this machine (pid, start time, pid namespace, random): launchers
    name and label what they create with it, so nothing of another pool is ever taken for theirs."""


@final
@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start."""

    worker_id: str
    endpoint: str
    """What the worker connects to (``ipc://…`` in ``runtime_dir``, or ``tcp://HOST:PORT``)."""
    heartbeat_interval: float
    """0 when the launcher watches processes itself; otherwise both sides send a heartbeat this
    often and treat silence past the pool's deadline as a loss."""
    server_key: bytes | None = None
    """The pool's CURVE public key (Z85), for tcp."""
    worker_keys: CurveKeys | None = field(default=None, repr=False)
    """Keys made for this worker and put on the pool's allow-list (tcp), or None."""


class LaunchedWorker:
    """A started worker as its launcher knows it. ``pid`` is its pid on this machine, in this pid
    namespace, or 0 where it has none here (a container's or another host's process)."""

    def __init__(self, worker_id: str, pid: int = 0) -> None:
        self.worker_id = worker_id
        self.pid = pid
        self.exit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolved once, when the worker is known to have ended (launchers set it)."""
        self.exit_reason: str | None = None
        """How it ended, in the engine's words, where the launcher knows more than "it exited"
        (a Pod that cannot be scheduled, an image that cannot be pulled, an eviction)."""

    def has_exited(self) -> bool:
        """It has ended, even if the event loop has not been told yet."""
        return self.exit.done()

    def describe(self) -> str:
        return f"worker {self.worker_id}"

    def _set_exited(self) -> None:
        if not self.exit.done():
            self.exit.set_result(None)


class PidfdWorker(LaunchedWorker):
    """A worker held through a process of this machine (the worker itself, or the command that
    runs it) as a verified pidfd: its ``exit`` resolves when that process exits."""

    def __init__(self, worker_id: str, pid: int, handle: procs.Pidfd | None) -> None:
        super().__init__(worker_id, pid=pid)
        self.handle = handle
        if handle is None:
            self._set_exited()  # gone before it could be looked at
        else:
            asyncio.get_running_loop().add_reader(handle.fd, self._on_readable)

    def _on_readable(self) -> None:
        if self.handle is not None:
            asyncio.get_running_loop().remove_reader(self.handle.fd)
        self._set_exited()

    def has_exited(self) -> bool:
        # The pidfd itself, not the loop's callback: a worker found dying at its release must not
        # be lent again even if the callback has not run yet.
        return self.exit.done() or (self.handle is not None and self.handle.exited())

    def close_handle(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.handle.fd)
            self.handle.close()
            self.handle = None


def server_key_argument(server_key: bytes) -> str:
    """``--server-key=<hex>``: how every launcher puts the supervisor's key on a worker's
    command line. In hex, because Z85 has ``$ ( ) & < > * ? [ ] { } # !``, which a remote shell
    (ssh joins its arguments for one) or Kubernetes' ``$(VAR)``/``$$`` expansion in a Pod's args
    would change (a key with ``$$`` reached the worker one character short), and may begin with
    ``-``, which argparse would take for an option."""
    return f"--server-key={key_to_hex(server_key)}"


def worker_argv(spec: WorkerSpec, tools: str, welcome_timeout: float) -> list[str]:
    """The arguments after the command that starts andon: ``worker --connect …`` for ``spec``."""
    return [
        "worker",
        "--connect",
        spec.endpoint,
        "--id",
        spec.worker_id,
        "--tools",
        tools,
        "--welcome-timeout",
        f"{welcome_timeout:g}",
    ]


class WorkerLauncher(abc.ABC):
    """Starts workers for one pool and ends them. Methods are called from the pool's event loop."""

    transport: Transport = "ipc"
    """Which endpoint the pool binds for this launcher's workers."""
    heartbeats: bool = True
    """Liveness through heartbeats (True) or through process handles of this machine (False)."""
    adopts: bool = False
    """It starts nothing: its workers are started by hand and dial in (:class:`AdoptLauncher`).
    The pool hands it the hellos of workers it does not know, and makes them no keys."""
    local_processes: bool = False
    """Its workers and their calls are processes of this pid namespace: a lost worker's call can
    be found by its tag and killed from here. Otherwise the launcher's ``kill`` is the backstop."""
    lost_call_note: str = "the worker stops the call's processes when it loses the supervisor"
    """What becomes of a lost worker's call, in the words its ``WORKER_LOST`` result gives."""
    containment: Containment | None = None
    """The containment mode its workers use, where the launcher decides it (local workers)."""

    async def open(self, setup: PoolSetup) -> None:  # noqa: B027 - optional
        """Called once by the pool before the first ``start``."""

    @abc.abstractmethod
    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        """Start one worker; return once it exists (its ``hello`` comes over the socket)."""

    @abc.abstractmethod
    def kill(self, worker: LaunchedWorker) -> None:
        """End the worker and everything it started, now, without waiting (the backstop).
        Never raises; the worker's ``exit`` resolves when it is gone."""

    def kill_idle(self, workers: Iterable[LaunchedWorker]) -> None:
        """End idle workers at a pool's close (they hold no call): as ``kill``, for each."""
        for worker in workers:
            self.kill(worker)

    def exited(self, worker: LaunchedWorker) -> Awaitable[None]:
        """Resolves once the worker has ended (awaiting it never cancels the watch)."""
        return asyncio.shield(worker.exit)

    async def stop(self, worker: LaunchedWorker, timeout: float) -> None:
        """The worker was asked to stop (``shutdown``): give it ``timeout`` seconds to exit, then
        kill it; return once it has exited (or after 5 s more, written off)."""
        try:
            await asyncio.wait_for(self.exited(worker), timeout)
        except TimeoutError:
            self.kill(worker)
            try:
                await asyncio.wait_for(self.exited(worker), 5.0)
            except TimeoutError:
                return

    def kill_call(self, worker: LaunchedWorker, tag: str, started: Started | None) -> None:  # noqa: B027
        """A lost worker's call: kill what it started. Only launchers with ``local_processes``
        can reach them; for the others the worker's own end (a container's removal kills every
        process in it) is what stops the call."""

    def release(self, worker: LaunchedWorker) -> None:  # noqa: B027 - optional
        """The worker has ended: free what the launcher held for it (fds, a reap, a removal)."""

    def hide_env(self, names: Iterable[str]) -> None:  # noqa: B027 - optional
        """Keep ``names`` out of workers started from now on; raise ``WorkerError`` if running
        workers already hold one of them."""

    def closing(self) -> None:  # noqa: B027 - optional
        """The pool closes: it starts no worker any more, and has just killed its idle ones. A
        helper that only starts workers (a forkserver) may be ended now, without waiting, so
        that its exit overlaps the workers'; :meth:`aclose` still waits for it."""

    async def aclose(self) -> None:  # noqa: B027 - optional
        """Called once by the pool, after every worker has ended."""
