"""The worker pool: warm local workers behind one ROUTER socket.

Workers are started through a ``multiprocess`` forkserver with the worker modules preloaded (a few
milliseconds a worker instead of ~100 ms for a fresh interpreter); the forkserver also hands each
worker the tool registry. The pool keeps ``size`` workers warm, watches each with a pidfd, and
replaces any that dies. A worker that breaks the protocol is killed, reaped and replaced: broken
means dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal as _signal
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import multiprocess
import multiprocess.context
import zmq
import zmq.asyncio
from multiprocess import popen_forkserver, spawn

from andon.base import Aborted, AbortSignal, ProtocolError, WorkerError, procs
from andon.protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    Hello,
    Message,
    Reject,
    Shutdown,
    Started,
    Welcome,
    decode,
    encode,
)
from andon.workers import ToolRegistry, WorkerOptions, worker_main
from andon.workers._containment import CgroupTree, ContainmentSetting, cgroup2_root, detect_mode

__all__ = ["WorkerGone", "WorkerLease", "WorkerPool", "WorkerPoolConfig"]

_PRELOAD = ["andon.workers"]
_log = logging.getLogger("andon.pool")


@dataclass(frozen=True)
class WorkerPoolConfig:
    size: int = 4
    containment: ContainmentSetting = "auto"
    start_timeout: float = 20.0  # hello deadline for one worker (generous: CI machines are slow)
    heartbeat_interval: float = 1.0  # remote workers only; local liveness comes from pidfds
    max_message_bytes: int = 16 * 1024 * 1024
    runtime_dir: str | None = None  # parent of the private 0700 folder; default XDG/tmp
    # Tests only: make every worker break the protocol on purpose (see WorkerOptions.fault).
    worker_fault: Literal["garbage-after-started"] | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a worker pool needs at least one worker")


@dataclass(frozen=True)
class WorkerGone:
    """Delivered to a lease when its worker died; ``on_purpose`` if the pool was told to kill it."""

    reason: str
    on_purpose: bool


@dataclass
class _Worker:
    worker_id: str
    process: Any  # multiprocess.Process
    pid: int = 0
    ready: asyncio.Future[Hello] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    pidfd: int | None = None
    handle: procs.Pidfd | None = None  # the same pidfd, verified: reaches the worker's group
    lease: WorkerLease | None = None
    killed_on_purpose: bool = False
    kill_reason: str | None = None
    dead: bool = False


class WorkerLease:
    """One worker, lent to one tool call. Messages for the call arrive on ``messages``."""

    def __init__(self, pool: WorkerPool, worker: _Worker) -> None:
        self._pool = pool
        self._worker = worker
        # Worker messages and WorkerGone, plus whatever the executor feeds its own timeline.
        self.messages: asyncio.Queue[object] = asyncio.Queue()
        self.started: Started | None = None
        self.tag: str | None = None  # the call's tag, once its run is sent

    @property
    def worker_id(self) -> str:
        return self._worker.worker_id

    @property
    def pid(self) -> int:
        return self._worker.pid

    @property
    def alive(self) -> bool:
        return not self._worker.dead

    async def send(self, msg: Message) -> None:
        await self._pool._send(self._worker, msg)

    def kill(self, reason: str) -> None:
        """Kill the worker and whatever its call started (broken means dead)."""
        self._worker.killed_on_purpose = True
        self._pool._kill(self._worker, reason)

    def release(self) -> None:
        self._pool._release(self)


class WorkerPool:
    """``async with WorkerPool(config, registry) as pool: lease = await pool.acquire(signal)``."""

    def __init__(self, config: WorkerPoolConfig, registry: ToolRegistry) -> None:
        self.config = config
        self.registry = registry
        self._worker_registry = registry.for_workers()
        self.containment = detect_mode(config.containment)
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._runtime: Path | None = None
        self._cgroups: CgroupTree | None = None
        self._workers: dict[str, _Worker] = {}
        self._idle: list[_Worker] = []
        self._idle_changed = asyncio.Event()
        self._counter = 0
        self._closing = False
        # Background tasks (the receiver, replacements, welcomes) are owned here and awaited by
        # close(): nothing is fire-and-forget.
        self._tasks: set[asyncio.Task[None]] = set()
        self._mp = multiprocess.get_context("forkserver")
        self.on_broken: Callable[[str, str], None] | None = None  # (worker id, reason), for tests
        self.error_replies: list[tuple[str, str]] = []  # error answers outside any call

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        parent = self.config.runtime_dir or os.environ.get("XDG_RUNTIME_DIR") or None
        if parent is not None and not os.path.isdir(parent):
            parent = None
        # ipc paths must stay under 107 bytes: a short private folder, never a deep test folder.
        self._runtime = Path(tempfile.mkdtemp(prefix="andon-", dir=parent))
        os.chmod(self._runtime, 0o700)
        endpoint = f"ipc://{self._runtime}/pool.sock"
        if len(endpoint) > 100:
            self._runtime.rmdir()
            self._runtime = Path(tempfile.mkdtemp(prefix="andon-", dir="/tmp"))
            endpoint = f"ipc://{self._runtime}/pool.sock"
        self._endpoint = endpoint
        if self.containment == "cgroup":
            root = cgroup2_root()
            if root is not None:
                CgroupTree.sweep_stale(root)
                # Random per pool: two pools in one process never share a tree.
                self._cgroups = CgroupTree.new(root, os.getpid())
                self._cgroups.create_base()
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        # A send to a worker that is gone fails (EHOSTUNREACH) instead of vanishing silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 500)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes * 2)
        sock.bind(endpoint)
        self._sock = sock
        self._mp.set_forkserver_preload(_PRELOAD)
        _ForkserverUsers.acquire()
        self._spawn_task(self._receive())
        try:
            workers = [self._spawn() for _ in range(self.config.size)]
            await asyncio.gather(*(self._await_ready(w) for w in workers))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop every worker and leave no process behind (workers, forkserver, tracker)."""
        if self._closing:
            return
        self._closing = True
        for worker in list(self._workers.values()):
            if not worker.dead and worker.pid:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send(worker, Shutdown(grace=0.0)), 1.0)
        for worker in list(self._workers.values()):
            await self._reap(worker, timeout=5.0)
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        _ForkserverUsers.release()
        if self._cgroups is not None:
            self._cgroups.remove_all()
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None

    # -- leasing ---------------------------------------------------------------------------

    async def acquire(self, signal: AbortSignal | None = None) -> WorkerLease:
        """Wait for an idle worker; raises ``Aborted`` if ``signal`` fires first."""
        while True:
            if signal is not None:
                signal.throw_if_aborted()
            if self._closing:
                raise WorkerError("the worker pool is closed")
            while self._idle:
                worker = self._idle.pop(0)
                if not worker.dead and not self._exited(worker):
                    lease = WorkerLease(self, worker)
                    worker.lease = lease
                    return lease
            self._idle_changed.clear()
            waiter = asyncio.ensure_future(self._idle_changed.wait())
            handle = signal.add_callback(_canceller(waiter)) if signal else None
            try:
                await waiter
            except asyncio.CancelledError:
                if signal is not None and signal.aborted:
                    raise Aborted(signal.reason) from None  # type: ignore[arg-type]
                raise
            finally:
                if handle is not None:
                    handle.remove()

    def _release(self, lease: WorkerLease) -> None:
        worker = lease._worker
        if worker.lease is lease:
            worker.lease = None
            if worker.dead or self._closing:
                return
            if self._exited(worker):
                # Dying: it would fail the next, unrelated call. Retire it; its exit (pidfd)
                # starts a replacement. (andon never signals a healthy worker: a call's stages
                # go to the call's own process group.)
                self._kill(worker, "retired: it is exiting")
                return
            self._idle.append(worker)
            self._idle_changed.set()

    @staticmethod
    def _exited(worker: _Worker) -> bool:
        """The worker has exited even if its pidfd callback has not run yet."""
        return worker.handle is not None and worker.handle.exited()

    @property
    def workers(self) -> dict[str, int]:
        """Live workers: id -> pid."""
        return {w.worker_id: w.pid for w in self._workers.values() if not w.dead}

    # -- workers ---------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        self._counter += 1
        worker_id = f"w{self._counter}"
        assert self._runtime is not None
        options = WorkerOptions(
            endpoint=self._endpoint,
            worker_id=worker_id,
            registry=self._worker_registry,
            supervisor_pid=os.getpid(),
            containment=self.containment,
            log_path=str(self._runtime / f"{worker_id}.log"),
            cgroup_base=str(self._cgroups.base) if self._cgroups is not None else None,
            max_message_bytes=self.config.max_message_bytes,
            fault=self.config.worker_fault,
        )
        process = _WorkerProcess(
            target=worker_main, args=(options,), name=f"andon-worker-{worker_id}", daemon=True
        )
        _ensure_forkserver()
        process.start()
        worker = _Worker(worker_id=worker_id, process=process, pid=process.pid)
        self._workers[worker_id] = worker
        info = procs.stat(worker.pid)
        # The worker is the forkserver's child, so nothing of ours pins its pid: hold it as a
        # verified pidfd from the start, and signal it only through that.
        handle = procs.Pidfd.open(info.key, zombie_ok=True) if info is not None else None
        if handle is None:
            worker.dead = True
            return worker
        worker.handle = handle
        worker.pidfd = handle.fd
        asyncio.get_running_loop().add_reader(worker.pidfd, self._on_exit, worker)
        return worker

    async def _await_ready(self, worker: _Worker) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(worker.ready), self.config.start_timeout)
        except TimeoutError:
            self._kill(worker, "no hello before the start deadline")
            raise WorkerError(
                f"worker {worker.worker_id} did not say hello within "
                f"{self.config.start_timeout:g}s",
                worker=worker.worker_id,
            ) from None
        self._idle.append(worker)
        self._idle_changed.set()

    async def _replace(self) -> None:
        if self._closing:
            return
        worker = self._spawn()
        with contextlib.suppress(WorkerError):
            await self._await_ready(worker)

    def _on_exit(self, worker: _Worker) -> None:
        """The worker's pidfd is readable: it exited, whatever the reason."""
        loop = asyncio.get_running_loop()
        if worker.pidfd is not None:
            loop.remove_reader(worker.pidfd)
        worker.dead = True
        if not worker.ready.done():
            worker.ready.set_exception(
                WorkerError(
                    f"worker {worker.worker_id} exited during start", worker=worker.worker_id
                )
            )
            worker.ready.exception()  # mark retrieved; the start path reports it
        lease = worker.lease
        if lease is not None:
            self._kill_call_processes(lease)
            reason = worker.kill_reason or (
                "ended by andon" if worker.killed_on_purpose else "the worker process died"
            )
            lease.messages.put_nowait(WorkerGone(reason, worker.killed_on_purpose))
        self._reap_now(worker)
        if not self._closing:
            self._spawn_task(self._replace())

    def _kill_call_processes(self, lease: WorkerLease) -> None:
        """A lost worker's call: SIGKILL every process carrying the call's tag, and its cgroup
        when it is a leaf of this pool's own tree. Never a group by number: the worker that
        pinned it is gone."""
        if lease.tag is None:
            return
        started = lease.started
        cgroup = Path(started.cgroup) if started is not None and started.cgroup else None
        if cgroup is None and self._cgroups is not None:
            # Lost before its ``started`` arrived: the leaf's name is known from the tag alone
            # (the worker names it so), and this pool's own tree is the only place it can be.
            cgroup = self._cgroups.base / f"call-{lease.tag}"
        owned = cgroup is not None and self._cgroups is not None and self._cgroups.owns(cgroup)
        leader = (
            procs.ProcessKey.from_create_time(started.pid, started.create_time)
            if started is not None
            else None
        )
        procs.kill_call(
            procs.CallIdentity(lease.tag, leader, cgroup if owned else None), cgroup_owned=owned
        )

    def _kill(self, worker: _Worker, reason: str) -> None:
        if worker.dead or not worker.pid:
            return
        if not worker.killed_on_purpose:
            _log.warning("killing worker %s: %s", worker.worker_id, reason)
            if self.on_broken is not None:
                self.on_broken(worker.worker_id, reason)
        worker.killed_on_purpose = True
        worker.kill_reason = worker.kill_reason or reason
        if worker.lease is not None:
            self._kill_call_processes(worker.lease)
        if worker.handle is not None:
            procs.signal_group(worker.handle, _signal.SIGKILL)

    def _reap_now(self, worker: _Worker) -> None:
        with contextlib.suppress(Exception):
            worker.process.join(0)
        if worker.handle is not None:
            worker.handle.close()
            worker.handle = None
            worker.pidfd = None
        self._workers.pop(worker.worker_id, None)

    async def _reap(self, worker: _Worker, timeout: float) -> None:
        if worker.dead:
            self._reap_now(worker)
            return
        fd = worker.pidfd
        if fd is not None:
            loop = asyncio.get_running_loop()
            exited = loop.create_future()
            loop.remove_reader(fd)
            loop.add_reader(fd, _resolve, exited)
            try:
                await asyncio.wait_for(asyncio.shield(exited), timeout)
            except TimeoutError:
                if worker.handle is not None:
                    procs.signal_group(worker.handle, _signal.SIGKILL)
                await asyncio.wait_for(exited, 5.0)
            finally:
                loop.remove_reader(fd)
        worker.dead = True
        self._reap_now(worker)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- wire ------------------------------------------------------------------------------

    async def _send(self, worker: _Worker, msg: Message) -> None:
        if self._sock is None or worker.dead:
            return
        try:
            await self._sock.send_multipart([worker.worker_id.encode(), *encode(msg)])
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._kill(worker, "its socket is gone")
                return
            raise

    async def _receive(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart(copy=True)
            if len(frames) < 2:
                continue
            identity = frames[0].decode("utf-8", "replace")
            worker = self._workers.get(identity)
            try:
                msg = decode(frames[1:], self.config.max_message_bytes)
            except ProtocolError as e:
                if worker is not None:
                    self._kill(worker, f"sent a bad frame: {e}")
                continue
            if worker is None or worker.dead or worker.kill_reason is not None:
                # A stranger, or a worker already written off: once andon decided to kill a
                # worker, nothing more it says is believed (its call gets WORKER_LOST).
                continue
            self._dispatch(worker, msg)

    def _dispatch(self, worker: _Worker, msg: Message) -> None:
        match msg:
            case Hello():
                if msg.protocol != PROTOCOL_VERSION:
                    self._spawn_task(self._send(worker, Reject(reason="protocol version mismatch")))
                    self._kill(worker, "protocol version mismatch")
                    return
                if not worker.ready.done():
                    worker.ready.set_result(msg)
                    self._spawn_task(
                        self._send(
                            worker,
                            Welcome(
                                heartbeat_interval=0.0,  # local: liveness through pidfds
                                max_message_bytes=self.config.max_message_bytes,
                            ),
                        )
                    )
            case _ if msg.type == "heartbeat":
                pass
            case ErrorReply() if msg.call_id is None or worker.lease is None:
                # The answer to a frame that was not about a call: note it, keep the worker.
                _log.warning("worker %s answered an error: %s", worker.worker_id, msg.reason)
                self.error_replies.append((worker.worker_id, msg.reason))
            case _:
                lease = worker.lease
                if lease is None:
                    self._kill(worker, f"sent {msg.type!r} with no call running")
                    return
                if isinstance(msg, Started):
                    lease.started = msg
                lease.messages.put_nowait(msg)


def _canceller(fut: asyncio.Future[Any]) -> Callable[[object], None]:
    def cancel(_cause: object) -> None:
        fut.cancel()

    return cancel


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _WorkerPopen(popen_forkserver.Popen):  # type: ignore[misc]
    """Starts a worker without re-running the parent's ``__main__`` in it.

    multiprocess normally re-imports the parent's main script in every child (so that objects
    defined there can be unpickled). For a worker that would re-run a user's driver script, or
    pytest. The registry is pickled by value where needed (dill), so the main module is not needed:
    leave it out of the preparation data.
    """

    def _launch(self, process_obj: Any) -> None:
        original = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data: dict[str, Any] = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data = original


class _WorkerProcess(multiprocess.context.ForkServerProcess):  # type: ignore[misc]
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _WorkerPopen(process_obj)


def _ensure_forkserver() -> None:
    """Start the forkserver, if it is not running, with ``ANDON_CALL_TAG`` holding a slot.

    Workers and their Python call processes are forks of it, never exec'd: the environment
    ``/proc`` shows for them is the forkserver's. The slot is the room a call process writes its
    call's tag into (:func:`andon.base.procs.stamp_tag`), so it carries the tag like every
    process a shell call starts.
    """
    from multiprocess import forkserver

    saved = os.environ.get(procs.TAG_VAR)
    os.environ[procs.TAG_VAR] = procs.TAG_SLOT
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop(procs.TAG_VAR, None)
        else:
            os.environ[procs.TAG_VAR] = saved


class _ForkserverUsers:
    """The forkserver (and multiprocess's resource tracker) are per-process singletons: the last
    pool to close stops them, so a closed pool leaves no helper process behind."""

    count = 0

    @classmethod
    def acquire(cls) -> None:
        cls.count += 1

    @classmethod
    def release(cls) -> None:
        cls.count -= 1
        if cls.count > 0:
            return
        from multiprocess import forkserver, resource_tracker

        with contextlib.suppress(Exception):
            forkserver._forkserver._stop()
        with contextlib.suppress(Exception):
            resource_tracker._resource_tracker._stop()
