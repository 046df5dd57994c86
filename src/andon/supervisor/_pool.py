"""The worker pool: warm local workers behind one ROUTER socket.

Workers are started through a ``multiprocess`` forkserver with the worker modules preloaded (a few
milliseconds a worker instead of ~100 ms for a fresh interpreter); the forkserver also hands each
worker the tool registry. The pool keeps ``size`` workers warm, watches each with a pidfd, and
replaces any that dies. A worker that breaks the protocol is killed, reaped and replaced: broken
means dead.

**Every lease is answered.** A call's lease gets its worker's messages and, if the worker is gone
before the call's result came through, exactly one :class:`WorkerGone`: when the worker dies, when
andon kills it, when the pool's receiver fails, and when the pool is closed under the call (after
the call's processes are killed). A call that asks a closed pool for a worker gets
``WorkerError`` at once, and so does every call still waiting for one when the pool closes.

Every task the pool starts (the receiver, replacements, welcomes) belongs to the pool's own
``asyncio.TaskGroup``, entered when the pool starts and exited when it closes. The children never
raise into it: a task group cancels the task that entered it when a child fails, and that is the
pool's user, not the pool.

(The module is larger than most: starting, watching, leasing and closing workers share one state,
and each way a worker ends must find every lease it holds.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal as _signal
import tempfile
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

import multiprocess
import multiprocess.context
import zmq
import zmq.asyncio
from multiprocess import popen_forkserver, spawn

from andon.base import AbortSignal, ProtocolError, WorkerError, procs
from andon.llm import API_KEY_ENV_VARS
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
from andon.workers import (
    CgroupTree,
    ContainmentSetting,
    ToolRegistry,
    WorkerOptions,
    cgroup2_root,
    detect_mode,
    worker_main,
)

__all__ = ["WorkerGone", "WorkerLease", "WorkerPool", "WorkerPoolConfig"]

_PRELOAD = ["andon.workers"]
_log = logging.getLogger("andon.pool")

POOL_CLOSED = "the worker pool was closed"
"""Why a closed pool's calls end: the reason of their ``WorkerGone``, and of ``acquire``'s error."""


@dataclass(frozen=True)
class WorkerPoolConfig:
    size: int = 4
    containment: ContainmentSetting = "auto"
    start_timeout: float = 20.0  # hello deadline for one worker (generous: CI machines are slow)
    # How long closing waits for a worker to exit after ``shutdown`` before it SIGKILLs the
    # worker's group (a worker stops its call with SIGKILL first, so this is only for one that
    # does not answer at all: stopped, swapped out, wedged).
    stop_timeout: float = 5.0
    heartbeat_interval: float = 1.0  # remote workers only; local liveness comes from pidfds
    max_message_bytes: int = 16 * 1024 * 1024
    runtime_dir: str | None = None  # parent of the private 0700 folder; default XDG/tmp
    # Tests only: make every worker break the protocol on purpose (see WorkerOptions.fault).
    worker_fault: Literal["garbage-after-started"] | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a worker pool needs at least one worker")
        if not self.stop_timeout >= 0:
            raise ValueError("stop_timeout must be a number of seconds, at least 0")


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
        self.gone = False  # its WorkerGone was delivered (there is only ever one)

    @property
    def worker_id(self) -> str:
        return self._worker.worker_id

    @property
    def pid(self) -> int:
        return self._worker.pid

    @property
    def alive(self) -> bool:
        return not self._worker.dead

    @property
    def pool_stopping(self) -> str | None:
        """Why the pool takes no more work (it is closing, or failed), or None while it runs."""
        return self._pool._stopping

    async def send(self, msg: Message) -> None:
        """Send ``msg`` to the worker. Raises only if ``msg`` cannot be encoded (then nothing was
        sent); a worker that cannot be reached is written off instead, and its exit answers the
        call with ``WorkerGone``."""
        await self._pool._send(self._worker, msg)

    async def send_frames(self, frames: list[bytes]) -> None:
        """Send a message already encoded (by :func:`andon.protocol.encode`); never raises for
        the transport, as :meth:`send`."""
        await self._pool._send_frames(self._worker, frames)

    def kill(self, reason: str) -> None:
        """Kill the worker and whatever its call started (broken means dead)."""
        self._worker.killed_on_purpose = True
        self._pool._kill(self._worker, reason)

    def release(self) -> None:
        self._pool._release(self)

    def _answer_gone(self, reason: str, on_purpose: bool) -> None:
        if not self.gone:
            self.gone = True
            self.messages.put_nowait(WorkerGone(reason, on_purpose))


class WorkerPool:
    """``async with WorkerPool(config, registry) as pool: lease = await pool.acquire(signal)``.

    No worker holds a model API key (workers.md, Tool environment): the forkserver is exec'd
    without andon's key variables and without ``hide_env`` (a custom adapter's ``api_key_env``,
    a caller's ``secret_env``), and the workers and call processes are forks of it. Start refuses
    (``WorkerError``) rather than start a worker whose environment holds one of them.
    """

    def __init__(
        self, config: WorkerPoolConfig, registry: ToolRegistry, *, hide_env: Iterable[str] = ()
    ) -> None:
        self.config = config
        self.registry = registry
        # The variables no worker of this pool may hold (it may only grow: see hide_env()).
        self.hidden_env: frozenset[str] = API_KEY_ENV_VARS | frozenset(hide_env)
        self._worker_registry = registry.for_workers()
        self.containment = detect_mode(config.containment)
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._runtime: Path | None = None
        self._cgroups: CgroupTree | None = None
        self._workers: dict[str, _Worker] = {}
        self._idle: list[_Worker] = []
        # Calls waiting for an idle worker: bare futures (not tasks), resolved by a release, a
        # new worker, the close, or the waiting call's own abort signal.
        self._waiters: set[asyncio.Future[None]] = set()
        self._counter = 0
        # Why no more work is taken (POOL_CLOSED, or the receiver's failure); None while running.
        self._stopping: str | None = None
        self._closed = False
        self._forkserver_held = False
        # Background tasks (the receiver, replacements, welcomes) belong to this task group, from
        # start() to aclose(); ``_tasks`` is the same set, kept to cancel them at the close.
        self._tg: asyncio.TaskGroup | None = None
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
        await self.aclose()

    async def start(self) -> None:
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise

    async def _start(self) -> None:
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
        self._forkserver_held = True
        self._spawn_task(self._receive)
        workers = [self._spawn() for _ in range(self.config.size)]
        # A task group, not gather, so no wait runs on after a failed start. Its children report
        # a failure rather than raise it: on Python 3.11 a child failing while the group exits
        # leaves the waiting task's cancel count raised for good (fixed in 3.12).
        async with asyncio.TaskGroup() as tg:
            waits = [tg.create_task(_error_of(self._await_ready, worker)) for worker in workers]
        for wait in waits:
            error = wait.result()
            if error is not None:
                raise error  # the first worker that did not start

    async def aclose(self) -> None:
        """Stop every worker and leave no process behind (workers, forkserver, tracker).

        Every call still running in a worker is answered: its worker stops it (SIGKILL to its
        group, then a sweep) and reports its result; if that result does not come through, the
        pool kills the call's processes itself and answers the lease with a ``WorkerGone``
        saying the pool was closed. Calls waiting for a worker get ``WorkerError``. Safe to call
        twice, and from any task (several sessions may share the pool).
        """
        if self._closed:
            return
        self._closed = True
        self._stop_taking_work(POOL_CLOSED)
        workers = list(self._workers.values())
        leases = [w.lease for w in workers if w.lease is not None]
        live = [w for w in workers if not w.dead and w.pid]
        # Idle workers hold nothing (a call is answered only once its process group is empty):
        # they are ended at once, all from one scan, instead of being asked to exit and waited
        # on through their interpreters' teardown (cli.md, A fast exit).
        idle = [w for w in live if w.lease is None]
        for worker in idle:
            worker.killed_on_purpose = True
            worker.kill_reason = worker.kill_reason or POOL_CLOSED
        self._end_idle(idle)
        for worker in live:
            if worker.lease is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send(worker, Shutdown(grace=0.0)), 1.0)
        # Killed idle workers are reaped last: by then their exits have overlapped the rest.
        for worker in [w for w in workers if w not in idle]:
            await self._reap_logged(worker)
        # The reap took each worker's exit over from _on_exit, so it is answered here: a call
        # whose result did not come through (the worker had to be killed, or exited first) still
        # gets exactly one answer, once nothing of it is left.
        for lease in leases:
            if lease._worker.lease is lease and not lease.gone:
                try:
                    self._kill_call_processes(lease)
                except Exception:
                    _log.exception("could not kill the processes of a call of a closed pool")
                lease._answer_gone(POOL_CLOSED, on_purpose=True)
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        if self._tg is not None:
            tg, self._tg = self._tg, None
            await tg.__aexit__(None, None, None)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._forkserver_held:
            self._forkserver_held = False
            _ForkserverUsers.release()
        for worker in idle:
            await self._reap_logged(worker)
        if self._cgroups is not None:
            self._cgroups.remove_all()
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None

    async def _reap_logged(self, worker: _Worker) -> None:
        try:
            await self._reap(worker, timeout=self.config.stop_timeout)
        except Exception:  # one worker that will not go must not keep the rest running
            _log.exception("could not reap worker %s", worker.worker_id)

    async def close(self) -> None:
        """The same as :meth:`aclose`."""
        await self.aclose()

    def hide_env(self, names: Iterable[str]) -> None:
        """Keep ``names`` out of this pool's workers too (a session that shares a running pool
        brings its own model's key variable).

        Raises ``WorkerError`` naming the variables (never their values) if the running workers
        already hold one of them: they are forks of a forkserver exec'd with it, and nothing
        short of a new forkserver (which needs every worker of the process gone) takes it out.
        """
        self.hidden_env = self.hidden_env | frozenset(names)
        held = _forkserver_holds(self.hidden_env)
        if held:
            raise WorkerError(_holds_message(held))

    def _stop_taking_work(self, reason: str) -> None:
        """No more leases: every call waiting for a worker wakes and gets ``WorkerError``."""
        if self._stopping is None:
            self._stopping = reason
        self._wake()

    def _wake(self) -> None:
        for waiter in list(self._waiters):
            _resolve(waiter)

    # -- leasing ---------------------------------------------------------------------------

    async def acquire(self, signal: AbortSignal | None = None) -> WorkerLease:
        """Wait for an idle worker; raises ``Aborted`` if ``signal`` fires first, and
        ``WorkerError`` if the pool is closed (or failed) or closes while this waits."""
        loop = asyncio.get_running_loop()
        while True:
            if signal is not None:
                signal.throw_if_aborted()
            if self._stopping is not None:
                raise WorkerError(self._stopping)
            while self._idle:
                worker = self._idle.pop(0)
                if not worker.dead and not self._exited(worker):
                    lease = WorkerLease(self, worker)
                    worker.lease = lease
                    return lease
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            handle = signal.add_callback(_resolver(waiter)) if signal else None
            try:
                await waiter  # then look again: a worker, the abort, or the close
            finally:
                self._waiters.discard(waiter)
                if handle is not None:
                    handle.remove()

    def _release(self, lease: WorkerLease) -> None:
        worker = lease._worker
        if worker.lease is lease:
            worker.lease = None
            if worker.dead or worker.kill_reason is not None or self._stopping is not None:
                return  # gone, or going: never lent again
            if self._exited(worker):
                # Dying: it would fail the next, unrelated call. Retire it; its exit (pidfd)
                # starts a replacement. (andon never signals a healthy worker: a call's stages
                # go to the call's own process group.)
                self._kill(worker, "retired: it is exiting")
                return
            self._idle.append(worker)
            self._wake()

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

        def process_of() -> _WorkerProcess:
            name = f"andon-worker-{worker_id}"
            return _WorkerProcess(target=worker_main, args=(options,), name=name, daemon=True)

        process = process_of()
        _ensure_forkserver(self.hidden_env)
        try:
            process.start()
        except (FileNotFoundError, ConnectionRefusedError):
            # The forkserver's listening socket is gone (multiprocess keeps it in the temporary
            # folder, which a tool's ``rm -rf /tmp/*`` empties): a new forkserver, and once more.
            _log.warning("the workers' forkserver lost its socket; starting a new one")
            _restart_forkserver(self.hidden_env)
            process = process_of()
            process.start()
        worker = _Worker(worker_id=worker_id, process=process, pid=process.pid)
        self._workers[worker_id] = worker
        # multiprocess restarts a forkserver that died between the check above and the start
        # (from the environment as it is then, keys and all): the worker is looked at, not
        # trusted, and one that would hold a key never gets a call.
        held = _forkserver_holds(self.hidden_env)
        info = procs.stat(worker.pid)
        # The worker is the forkserver's child, so nothing of ours pins its pid: hold it as a
        # verified pidfd from the start, and signal it only through that.
        handle = procs.Pidfd.open(info.key, zombie_ok=True) if info is not None else None
        if held and handle is not None:
            procs.signal_group(handle, _signal.SIGKILL)
            handle.close()
            self._workers.pop(worker_id, None)
            with contextlib.suppress(Exception):
                process.join(5.0)
            raise WorkerError(_holds_message(held), worker=worker_id)
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
        self._wake()

    async def _replace(self) -> None:
        if self._stopping is not None:
            return
        try:
            worker = self._spawn()
        except Exception as e:
            # No replacement: if no worker is left, a call waiting for one would wait forever;
            # it gets the reason instead (WORKER_LOST, not run).
            _log.warning("could not start a replacement worker: %s: %s", type(e).__name__, e)
            if not any(not w.dead for w in self._workers.values()):
                self._stop_taking_work(f"no worker could be started ({type(e).__name__}: {e})")
            return
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
            reason = (
                worker.kill_reason
                or self._stopping
                or ("ended by andon" if worker.killed_on_purpose else "the worker process died")
            )
            lease._answer_gone(reason, worker.killed_on_purpose or self._stopping is not None)
        self._reap_now(worker)
        if self._stopping is None:
            self._spawn_task(self._replace)

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

    def _end_idle(self, idle: list[_Worker]) -> None:
        """SIGKILL idle workers and whatever joined their process groups or cgroups. In cgroup
        mode a worker's leaf holds the worker and anything that slipped into its group, and
        ``cgroup.kill`` needs no scan of ``/proc`` (a few ms on a busy machine); otherwise one
        scan serves every worker."""
        handles = [w.handle for w in idle if w.handle is not None]
        if self._cgroups is None:
            procs.signal_groups(handles, _signal.SIGKILL)
            return
        for handle in handles:
            handle.send(_signal.SIGKILL)
        for worker in idle:
            leaf = self._cgroups.base / f"worker-{worker.worker_id}"
            if leaf.is_dir():
                CgroupTree.kill(leaf)

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

    def _spawn_task(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``fn(*args)`` in the pool's task group. The coroutine is made inside the task, so
        one cancelled before it starts (at the close) leaves no coroutine never awaited."""
        if self._tg is None:  # closed: there is nothing left to do it for
            return
        task = self._tg.create_task(_never_raises(fn, *args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- wire ------------------------------------------------------------------------------

    async def _send(self, worker: _Worker, msg: Message) -> None:
        # Encoded first, so that a message that cannot be encoded raises with nothing sent.
        await self._send_frames(worker, encode(msg, max_bytes=self.config.max_message_bytes))

    async def _send_frames(self, worker: _Worker, frames: list[bytes]) -> None:
        sock = self._sock
        if sock is None or worker.dead:
            return
        try:
            await sock.send_multipart([worker.worker_id.encode(), *frames])
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this task was cancelled: never swallowed
            # Closing the socket cancels the sends still pending on it: the pool is closing,
            # and the close answers this worker's call.
        except zmq.ZMQError as e:
            # The worker cannot be reached (EHOSTUNREACH: it is gone), or the transport to it is
            # broken: either way it is lost, and its exit answers its call.
            reason = "its socket is gone" if e.errno == zmq.EHOSTUNREACH else f"sending failed: {e}"
            self._kill(worker, reason)

    async def _receive(self) -> None:
        assert self._sock is not None
        sock = self._sock
        try:
            while True:
                frames = await sock.recv_multipart(copy=True)
                try:
                    self._on_frames(frames)
                except Exception as e:
                    # A bug handling one message must not end the receiver (every call would
                    # wait forever): the worker it came from is written off, its call answered.
                    _log.exception("could not handle a worker's message")
                    worker = self._workers.get(frames[0].decode("utf-8", "replace"))
                    if worker is not None:
                        self._kill(worker, f"andon could not handle its message: {e!r}")
        except Exception as e:
            if self._stopping is None:
                _log.exception("the worker pool's receiver failed")
                self._fail(f"the worker pool failed: its receiver stopped ({e!r})")

    def _fail(self, reason: str) -> None:
        """Nothing more can be heard from any worker: take no more work and kill every worker,
        so that each running call is answered (its worker's exit gives it ``WorkerGone``)."""
        self._stop_taking_work(reason)
        for worker in list(self._workers.values()):
            self._kill(worker, reason)

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return
        identity = frames[0].decode("utf-8", "replace")
        worker = self._workers.get(identity)
        try:
            msg = decode(frames[1:], self.config.max_message_bytes)
        except ProtocolError as e:
            if worker is not None:
                self._kill(worker, f"sent a bad frame: {e}")
            return
        if worker is None or worker.dead or worker.kill_reason is not None:
            # A stranger, or a worker already written off: once andon decided to kill a
            # worker, nothing more it says is believed (its call gets WORKER_LOST).
            return
        self._dispatch(worker, msg)

    def _dispatch(self, worker: _Worker, msg: Message) -> None:
        match msg:
            case Hello():
                if msg.protocol != PROTOCOL_VERSION:
                    self._spawn_task(self._send, worker, Reject(reason="protocol version mismatch"))
                    self._kill(worker, "protocol version mismatch")
                    return
                if not worker.ready.done():
                    worker.ready.set_result(msg)
                    welcome = Welcome(
                        heartbeat_interval=0.0,  # local: liveness through pidfds
                        max_message_bytes=self.config.max_message_bytes,
                    )
                    self._spawn_task(self._send, worker, welcome)
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


def _resolver(fut: asyncio.Future[None]) -> Callable[[object], None]:
    def resolve(_cause: object) -> None:
        _resolve(fut)

    return resolve


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _error_of(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> Exception | None:
    """``fn(*args)``'s failure, returned rather than raised (the coroutine is made in the task,
    as in :func:`_never_raises`)."""
    try:
        await fn(*args)
    except Exception as e:
        return e
    return None


async def _never_raises(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """A pool task's body: a failure is logged, never raised into the pool's task group (which
    would cancel the task that started the pool)."""
    try:
        await fn(*args)
    except Exception:
        _log.exception("a worker pool task failed")


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


def _ensure_forkserver(hidden: frozenset[str]) -> None:
    """Start the forkserver, if it is not running, from a scrubbed environment: without any
    variable in ``hidden`` (or hidden by an earlier pool of this process), and with
    ``ANDON_CALL_TAG`` holding a slot.

    Workers and their Python call processes are forks of it, never exec'd: the environment
    ``/proc`` shows for them is the one the forkserver was exec'd with, whatever their
    ``os.environ`` says later. So the keys must be out of ``os.environ`` at the moment multiprocess
    execs it (it passes the environment as it is then), and only then: the supervisor keeps its
    own keys, which its model needs. The slot is the room a call process writes its call's tag
    into (:func:`andon.base.procs.stamp_tag`), so it carries the tag like every process a shell
    call starts.

    The forkserver is one per process, shared by every pool. One already running whose
    environment holds a variable in ``hidden`` (a later pool brought a key variable the first did
    not hide) cannot be replaced while workers of it live (each holds it open), so this refuses
    with ``WorkerError`` rather than start a worker that holds a key.
    """
    from multiprocess import forkserver, resource_tracker

    _Scrub.names |= hidden
    held = _forkserver_holds(hidden)
    if held:
        raise WorkerError(_holds_message(held))
    if _forkserver_pid() is not None:
        return  # running, and clean of every name asked for
    names = (procs.TAG_VAR, *sorted(_Scrub.names))
    saved = {name: os.environ.get(name) for name in names}
    # The forkserver (and multiprocess's resource tracker, started with it) live in the
    # supervisor's process group, where a CI runner's SIGINT/SIGTERM/SIGHUP to the whole group
    # also lands: one that dies of it (or prints a KeyboardInterrupt while its interpreter
    # starts) takes the pool's start with it. Spawned with those signals blocked, they keep them
    # blocked for life (neither unblocks them); the workers, forks of it, unblock every signal
    # once they have their own session (workers/_main.py). What arrives here meanwhile stays
    # pending and is delivered to the supervisor when the mask is restored.
    stop_signals = {_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP}
    mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, stop_signals)
    try:
        for name in _Scrub.names:
            os.environ.pop(name, None)
        os.environ[procs.TAG_VAR] = procs.TAG_SLOT
        # The resource tracker blocks SIGINT/SIGTERM around its own spawn and *unblocks* them
        # on its way out; started first, on its own, it cannot unblock them under the forkserver.
        resource_tracker.ensure_running()
        _signal.pthread_sigmask(_signal.SIG_BLOCK, stop_signals)
        forkserver.ensure_running()
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _restart_forkserver(hidden: frozenset[str]) -> None:
    """Replace a forkserver that can no longer be reached (its socket deleted). It is this
    process's unreaped child: SIGKILLed, reaped, then started afresh, scrubbed as always. The
    workers it forked are independent of it and keep running."""
    from multiprocess import forkserver, util

    # multiprocess made its temporary folder once and keeps using it: the new socket goes there.
    folder = util.get_temp_dir()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        procs.kill_child(server._forkserver_pid, _signal.SIGKILL)
        with contextlib.suppress(Exception):  # its socket file is already gone: unlink fails
            server._stop()
    server._forkserver_pid = None
    server._forkserver_address = None
    _ensure_forkserver(hidden)


class _Scrub:
    """Every variable a pool of this process asked to hide: a forkserver started (or restarted)
    for any pool leaves them all out, so it suits every pool already open."""

    names: frozenset[str] = frozenset()


def _forkserver_pid() -> int | None:
    """The running forkserver's pid, or None. Never reaps it (multiprocess does, and restarts
    a dead one itself); it is this process's unreaped child, so the pid cannot be reused."""
    from multiprocess import forkserver

    pid: int | None = forkserver._forkserver._forkserver_pid
    return pid if pid is not None and procs.child_running(pid) else None


def _forkserver_holds(names: frozenset[str]) -> list[str]:
    """Which of ``names`` the running forkserver was exec'd with (so every worker holds them)."""
    pid = _forkserver_pid()
    if pid is None:
        return []
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            block = f.read()
    except OSError:
        return []
    present = {entry.partition(b"=")[0].decode("utf-8", "replace") for entry in block.split(b"\0")}
    return sorted(present & names)


def _holds_message(held: list[str]) -> str:
    shown = ", ".join(f"${name}" for name in held)
    return (
        f"the workers' forkserver, shared by this process's worker pools, was started with "
        f"{shown} in its environment, so a tool could read it; close the other pools first "
        f"(a new forkserver starts without it), or give the first pool hide_env=[...] naming it"
    )


class _ForkserverUsers:
    """The forkserver (and multiprocess's resource tracker) are per-process singletons: the last
    pool to close stops them, so a closed pool leaves no helper process behind.

    Stopped with SIGKILL, then reaped: asked politely, each would exit through a full interpreter
    teardown (about 25 and 15 ms measured, on the exit path of every ``andon run``), and neither
    holds anything by then: the forkserver only forks workers (none is being started once the
    last pool closed), and the tracker only tracks named resources, which andon never creates.
    The forkserver is andon's (the pools set its preload and start it, and multiprocess restarts
    it for them); a tracker that was already running when the first of the open pools started
    belongs to whoever started it and is left alone (``foreign_tracker``)."""

    count = 0
    foreign_tracker: ClassVar[int | None] = None

    @classmethod
    def acquire(cls) -> None:
        if cls.count == 0:
            from multiprocess import resource_tracker

            cls.foreign_tracker = resource_tracker._resource_tracker._pid
        cls.count += 1

    @classmethod
    def release(cls) -> None:
        cls.count -= 1
        if cls.count > 0:
            return
        from multiprocess import forkserver, resource_tracker

        server, tracker = forkserver._forkserver, resource_tracker._resource_tracker
        ours_server = server._forkserver_pid is not None
        ours_tracker = tracker._pid is not None and tracker._pid != cls.foreign_tracker
        # Both killed first, then both reaped: their exits overlap.
        if ours_server:
            procs.kill_child(server._forkserver_pid, _signal.SIGKILL)
        if ours_tracker:
            procs.kill_child(tracker._pid, _signal.SIGKILL)
        if ours_server:
            with contextlib.suppress(Exception):
                server._stop()  # closes its fds and reaps it
        if ours_tracker:
            with contextlib.suppress(Exception):
                tracker._stop()
