"""The worker pool: workers behind one ROUTER socket, started and ended through a launcher.

The pool keeps up to ``size`` workers warm (one from its start, the others from the first time a
call waits for a worker), watches each (through its launcher's exit signal and, for
workers that are not this machine's processes, heartbeats with a deadline), and replaces any that
ends. A worker that breaks the protocol is killed and replaced: broken means dead. Where a worker
runs is the launcher's business (:mod:`andon.fleet._launch`): local forks of a forkserver by
default, containers, or another host over tcp + CURVE.

**Every lease is answered.** A call's lease gets its worker's messages and, if the worker is gone
before the call's result came through, exactly one :class:`WorkerGone`: when the worker dies, when
andon kills it, when it falls silent past the heartbeat deadline, when the pool's receiver fails,
and when the pool is closed under the call (after the call's processes are killed). A call that
asks a closed pool for a worker gets ``WorkerError`` at once, and so does every call still waiting
for one when the pool closes.

The pool's life is one value (:class:`~andon.fleet._pool_state.PoolState`: new, starting, open,
stopped, closing, closed), and what it opens on the way up (its folder, socket, launcher, task
group) is held by one exit stack that the close unwinds (docs/workers.md, The pool's life).

Every task the pool starts (the receiver, replacements, welcomes, heartbeats) belongs to the pool's
own ``asyncio.TaskGroup``, entered when the pool starts and ended when it closes. The children
never raise into it: a task group cancels the task that entered it when a child fails, and that is
the pool's user, not the pool.

(The module is larger than most: starting, watching, leasing and closing workers share one state,
and each way a worker ends must find every lease it holds.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, final
from urllib.parse import urlsplit

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from andon import procs
from andon.base import (
    API_KEY_ENV_VARS,
    AbortSignal,
    Clock,
    ConfigError,
    ContainmentSetting,
    NoWorkerStarted,
    ProtocolError,
    SystemClock,
    WorkerError,
    clean_text,
)
from andon.fleet._adopt import AdoptedWorker, AdoptLauncher, Arrival
from andon.fleet._forkserver import ForkserverLauncher
from andon.fleet._launch import LaunchedWorker, PoolSetup, WorkerLauncher, WorkerSpec
from andon.fleet._pool_state import POOL_CLOSED, Phase, PoolState
from andon.fleet._pool_watch import PoolObserver, PoolStatistics
from andon.protocol import (
    PROTOCOL_VERSION,
    Ack,
    CurveKeys,
    ErrorReply,
    Heartbeat,
    Hello,
    Message,
    Refused,
    Result,
    Shutdown,
    Started,
    Welcome,
    ZapAllowList,
    curve_server,
    is_loopback,
    recv_routed,
    send_routed,
    send_routed_sync,
)
from andon.workers import ToolRegistry

__all__ = ["TcpListen", "WorkerGone", "WorkerLease", "WorkerPool", "WorkerPoolConfig"]

_log = logging.getLogger("andon.pool")

DEFAULT_START_TIMEOUT = 60.0
"""The default hello deadline of one worker's start: with 50 ``andon run`` started at once on 2
cores the slowest hello took 33 s (docs/ci.md, Start-up under load); about twice that leaves room
for a busier runner, and a start that misses it is retried anyway."""

START_ATTEMPTS = 3
"""How many times one worker's start is tried (a missed hello deadline, a worker that exited while
it started, a launcher's OSError) before that worker is given up on."""

START_BACKOFF = (1.0, 2.0)
"""The pauses before the second and the third attempt, in seconds."""

START_WARNING_INTERVAL = 10.0
"""A failed start is one warning line, and at most one such line in this many seconds (the rest
are counted into the next): a pool that cannot start workers must not flood stderr."""

HEARTBEAT_MISSES = 3
"""A worker (or a supervisor, seen from a worker) is lost after this many heartbeat intervals of
silence: with the default 1 s interval, lost after 3 s (docs/scale-out.md,
``andon worker --connect ENDPOINT``)."""


@dataclass(frozen=True)
class _Wire:
    """What start() opened for the workers to reach the pool (its exit stack closes each)."""

    runtime: Path  # the private 0700 folder: the ipc socket, the workers' logs
    endpoint: str  # what workers connect to
    sock: zmq.asyncio.Socket  # ROUTER
    zap: ZapAllowList | None = None  # tcp + CURVE: who may connect
    server_keys: CurveKeys | None = None


class _GroupEnded(Exception):
    """Raised in the pool's task group to end it: every task still in it is cancelled."""


@final
@dataclass(frozen=True)
class TcpListen:
    """Where a pool listens for workers on other hosts (``tcp://`` + CURVE).

    ``address`` is bound (port 0: any free port); workers dial ``advertise`` (default: the bound
    address). The pool's server keys are ``server_keys`` or made for the pool; each worker the
    launcher starts gets keys of its own on the allow-list, and ``allowed`` adds the public keys of
    workers started some other way (``andon keys generate``). Plain tcp only with ``insecure``, and
    then only on a loopback address.
    """

    address: str
    advertise: str | None = None
    server_keys: CurveKeys | None = field(default=None, repr=False)
    allowed: frozenset[bytes] = frozenset()
    insecure: bool = False

    def __post_init__(self) -> None:
        host = _tcp_host(self.address, "listen address")
        if self.advertise is not None:
            _tcp_host(self.advertise, "advertised address")
        if self.insecure and not is_loopback(host):
            raise ConfigError(
                f"plain tcp (--insecure) is allowed only on a loopback address, not {host!r}: "
                f"workers on other hosts need CURVE keys (andon keys generate)"
            )


@final
@dataclass(frozen=True)
class WorkerPoolConfig:
    size: int = 4
    containment: ContainmentSetting = "auto"  # local workers (the default launcher)
    # The hello deadline of one worker's start (docs/workers.md, Starting workers). A missed one
    # is retried; a pool with no worker that keeps failing gives up after about this long.
    start_timeout: float = DEFAULT_START_TIMEOUT
    # How long closing waits for a worker to exit after ``shutdown`` before it kills it (a worker
    # stops its call with SIGKILL first, so this is only for one that does not answer at all:
    # stopped, swapped out, wedged).
    stop_timeout: float = 5.0
    # Workers that are not this machine's processes only; local liveness comes from pidfds.
    heartbeat_interval: float = 1.0
    max_message_bytes: int = 16 * 1024 * 1024
    runtime_dir: str | None = None  # parent of the private 0700 folder; default XDG/tmp
    tcp: TcpListen | None = None  # for launchers whose workers dial tcp

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a worker pool needs at least one worker")
        if not self.start_timeout > 0:
            raise ValueError("start_timeout must be a number of seconds, above 0")
        if not self.stop_timeout >= 0:
            raise ValueError("stop_timeout must be a number of seconds, at least 0")
        if not self.heartbeat_interval > 0:
            raise ValueError("heartbeat_interval must be a number of seconds, above 0")

    @property
    def heartbeat_deadline(self) -> float:
        return self.heartbeat_interval * HEARTBEAT_MISSES


@dataclass(frozen=True)
class WorkerGone:
    """Delivered to a lease when its worker died; ``on_purpose`` if the pool was told to kill it."""

    reason: str
    on_purpose: bool
    call_note: str = "andon killed the call's processes"
    """What became of the call's processes (the launcher's words)."""


@dataclass
class _Worker:
    worker_id: str
    launched: LaunchedWorker | None = None  # None while its launcher starts it
    ready: asyncio.Future[Hello] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    lease: WorkerLease | None = None
    killed_on_purpose: bool = False
    kill_reason: str | None = None
    dead: bool = False
    ended: bool = False  # its end was handled (answered, replaced); a later exit only frees it
    heard: float = 0.0  # time.monotonic() of its last message (heartbeat deadline)
    hello_pid: int = 0

    @property
    def welcomed(self) -> bool:
        """It said hello and was accepted (its start succeeded)."""
        return self.ready.done() and not self.ready.cancelled() and self.ready.exception() is None

    @property
    def pid(self) -> int:
        """Its pid on this machine, else the pid it reported (its own namespace's)."""
        if self.launched is not None and self.launched.pid:
            return self.launched.pid
        return self.hello_pid


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
        await self._pool._send(self._worker, frames)

    def kill(self, reason: str) -> None:
        """Kill the worker and whatever its call started (broken means dead)."""
        self._worker.killed_on_purpose = True
        self._pool._kill(self._worker, reason)

    def release(self) -> None:
        self._pool._release(self)

    def _answer_gone(self, reason: str, on_purpose: bool) -> None:
        if not self.gone:
            self.gone = True
            note = self._pool.launcher.lost_call_note
            self.messages.put_nowait(WorkerGone(reason, on_purpose, note))


@final
class WorkerPool:
    """``async with WorkerPool(config, registry) as pool: lease = await pool.acquire(signal)``.

    ``launcher`` starts the workers (default: :class:`ForkserverLauncher`, local forks). No worker
    holds a model API key (docs/workers.md, Tools): a launcher starts its workers without
    andon's key variables and without ``hide_env`` (a custom adapter's ``api_key_env``, a
    caller's ``secret_env``), and refuses (``WorkerError``) rather than start one that holds one.
    """

    def __init__(
        self,
        config: WorkerPoolConfig,
        registry: ToolRegistry,
        *,
        hide_env: Iterable[str] = (),
        launcher: WorkerLauncher | None = None,
        observer: PoolObserver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self._clock: Clock = clock or SystemClock()  # hello deadlines and start back-off
        self._observer = observer or PoolObserver()
        self.registry = registry
        # The variables no worker of this pool may hold (it may only grow: see hide_env()).
        self.hidden_env: frozenset[str] = API_KEY_ENV_VARS | frozenset(hide_env)
        self._worker_registry = registry.for_workers()
        self.launcher: WorkerLauncher = launcher or ForkserverLauncher(config.containment)
        self.containment = self.launcher.containment
        self.identity = _pool_identity()
        """Unique to this pool on this machine; launchers name and label what they make with it."""
        if self.launcher.transport == "tcp" and config.tcp is None:
            raise ConfigError("this launcher's workers dial tcp: give the pool config a tcp=")
        self._state = PoolState()
        # What start() opens, each closed in reverse by aclose(): the private folder, the
        # socket and its ZAP handler, the launcher, the task group, the workers.
        self._stack = contextlib.AsyncExitStack()
        self._wire: _Wire | None = None  # set once start() listens
        # Every background task (the receiver, heartbeats, starts, welcomes) belongs to this
        # group, from start() to aclose(); None outside those: nothing more is started.
        self._tg: asyncio.TaskGroup | None = None
        self._keys_of: dict[str, bytes] = {}  # worker id -> the public key made for it (tcp)
        self._spoofed = 0  # frames dropped: sent under another worker's name (tcp + CURVE)
        self._workers: dict[str, _Worker] = {}
        self._idle: list[_Worker] = []
        # Calls waiting for an idle worker: bare futures (not tasks), resolved by a release, a
        # new worker, the close, or the waiting call's own abort signal.
        self._waiters: set[asyncio.Future[None]] = set()
        self._counter = 0
        self._error_replies: list[tuple[str, str]] = []  # error answers outside any call
        # Starting workers (docs/workers.md, Starting workers): start() waits for the first
        # worker only; the others start when calls wait for a worker (or at once, if the first
        # start failed).
        self._first = asyncio.Event()  # set: a worker is ready, or none will be
        self._rest_to_start = 0  # workers of the pool's size not started yet
        self._starting = 0  # start tasks running (each tries one worker, START_ATTEMPTS times)
        self._settled = asyncio.Event()  # no start under way (wait_started)
        self._failing_since: float | None = None  # the first failed start with no worker ready
        self._failed_starts = _FailedStarts()

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
        """Open the pool and wait for its first worker (docs/workers.md, Starting workers).

        What is opened goes onto the pool's exit stack as it opens; a failure, or a stop (this
        task cancelled) at any moment, closes all of it (:meth:`aclose`) before it is raised.
        """
        if self._state.phase is not Phase.NEW:
            raise WorkerError(f"a worker pool starts once (this one is {self._state.phase.value})")
        self._state = PoolState(Phase.STARTING)
        try:
            await self._open()
            await self._start_first()
        except BaseException:
            await self.aclose()
            # A close from another task that began while this one still opened things: what
            # was opened after it is undone here (there is nothing left otherwise).
            await self._stack.aclose()
            raise
        self._state = self._state.opened()

    async def wait_started(self) -> None:
        """Start every worker not started yet, and wait until no worker's start is under way:
        each has said hello or was given up on. ``start()`` returns with one worker ready and
        the others start on demand (_demand); a benchmark that wants every worker warm first
        waits for this."""
        self._start_rest()
        await self._settled.wait()

    @property
    def endpoint(self) -> str:
        """What this pool's workers connect to (``ipc://…`` or ``tcp://HOST:PORT``)."""
        return self._wire.endpoint if self._wire is not None else ""

    @property
    def server_public_key(self) -> bytes | None:
        """The pool's CURVE public key (Z85) when it listens on tcp with CURVE."""
        keys = self._wire.server_keys if self._wire is not None else None
        return keys.public if keys is not None else None

    async def _open(self) -> None:
        """Open what the pool runs on, each pushed onto the exit stack right as it opens, so
        that the close undoes exactly what was done, in reverse: the private folder, the
        socket (and its ZAP handler), the launcher, then the task group and the workers."""
        stack = self._stack
        runtime, endpoint = _private_folder(self.config.runtime_dir)
        stack.callback(shutil.rmtree, runtime, ignore_errors=True)
        ctx = zmq.asyncio.Context()
        stack.callback(ctx.term)  # last of the wire: each socket is closed by then
        zap, keys = await self._serve_zap(ctx)
        sock = ctx.socket(zmq.ROUTER)
        stack.callback(sock.close, linger=0)  # before the ZAP handler: handshakes fail from then
        # A send to a worker that is gone fails (EHOSTUNREACH) instead of vanishing silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 500)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes * 2)
        if keys is not None:
            curve_server(sock, keys)
        self._wire = _Wire(runtime, self._bind(sock, endpoint), sock, zap, keys)
        await self.launcher.open(
            PoolSetup(
                runtime_dir=runtime,
                registry=self._worker_registry,
                hidden_env=self.hidden_env,
                max_message_bytes=self.config.max_message_bytes,
                identity=self.identity,
            )
        )
        stack.push_async_callback(self._close_launcher)
        stack.push_async_callback(self._reap_workers)
        await stack.enter_async_context(self._task_group())
        stack.push_async_callback(self._end_workers)  # the first thing the close does
        self._spawn_task(self._receive, self._wire)
        if self.launcher.heartbeats:
            self._spawn_task(self._heartbeats)
        if zap is not None:
            self._spawn_task(self._watch_handshakes, sock)

    async def _start_first(self) -> None:
        """One worker first, alone: on a loaded machine its hello is not slowed by its siblings'
        starts. The rest start on demand, when a call waits for a worker (_demand), or at once
        if the first's first attempt failed (_started_one): the first step needs one worker,
        and a one-call job never pays for the other three (docs/workers.md, Starting
        workers)."""
        self._rest_to_start = self.config.size - 1
        self._start_worker()
        await self._first.wait()
        if not self._has_ready_worker():
            raise NoWorkerStarted(self._state.stopped or "no tool worker could be started")

    async def _serve_zap(
        self, ctx: zmq.asyncio.Context
    ) -> tuple[ZapAllowList | None, CurveKeys | None]:
        """Over tcp with CURVE: the pool's server keys, and the ZAP handler that lets in only the
        workers on its allow-list (None, None otherwise)."""
        tcp = self.config.tcp
        if self.launcher.transport != "tcp" or tcp is None or tcp.insecure:
            return None, None
        keys = tcp.server_keys or CurveKeys.generate()
        # The ZAP handler must serve before the socket binds: a handshake reaching a socket with
        # no handler is accepted unchecked.
        zap = ZapAllowList(tcp.allowed, on_refused=self._on_refused)
        await zap.start(ctx)
        self._stack.push_async_callback(_quietly, zap.aclose)
        return zap, keys

    def _bind(self, sock: zmq.asyncio.Socket, ipc_endpoint: str) -> str:
        """Bind the pool's socket: what its workers connect to."""
        tcp = self.config.tcp
        if self.launcher.transport != "tcp" or tcp is None:
            sock.bind(ipc_endpoint)
            return ipc_endpoint
        sock.bind(tcp.address)
        bound = sock.getsockopt(zmq.LAST_ENDPOINT)
        bound_text = bound.decode() if isinstance(bound, bytes) else str(bound)
        if tcp.advertise is None:
            return bound_text
        advertised = urlsplit(tcp.advertise)
        return f"tcp://{advertised.hostname}:{advertised.port or urlsplit(bound_text).port}"

    async def _watch_handshakes(self, sock: zmq.asyncio.Socket) -> None:
        """Over tcp + CURVE, a client that fails the handshake for want of CURVE (plain tcp, a
        worker started without ``--server-key``/``--keys``, not a worker at all) is logged: zmq
        drops it quietly. (A key not on the allow-list is logged by the ZAP handler, with its
        address.) At most one line per START_WARNING_INTERVAL, the rest counted into the next:
        a client may retry every 0.1 s."""
        monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        )
        said_at: float | None = None
        unsaid = 0
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                now = time.monotonic()
                if said_at is not None and now - said_at < START_WARNING_INTERVAL:
                    unsaid += 1
                    continue
                endpoint = clean_text(event["endpoint"])
                more = f" ({unsaid} more since the last such line)" if unsaid else ""
                why = _handshake_failure(event["event"], event["value"])
                self._on_refused(f"a client failed the handshake on {endpoint}: {why}{more}")
                said_at, unsaid = now, 0
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)

    def _on_refused(self, reason: str) -> None:
        _log.warning("a worker was refused at the handshake: %s", reason)
        self._tell(lambda: self._observer.on_refused(reason))

    @contextlib.asynccontextmanager
    async def _task_group(self) -> AsyncIterator[None]:
        """The pool's task group, from start() to aclose(). Its tasks never end on their own
        (the receiver, the heartbeats) or not soon (a start's back-off): the group is ended by
        raising in it, which cancels every task still in it, and then waits for them."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                try:
                    yield
                finally:
                    self._tg = None  # nothing more is started in it
                    stops = _stops_asked()
                raise _GroupEnded
        except* _GroupEnded:
            # A group already ending does not raise a cancel that lands while it waits for its
            # tasks (it would end them anyway): the close goes on, and raises it at its end.
            if _stops_asked() > stops:
                raise asyncio.CancelledError from None

    async def aclose(self) -> None:
        """Stop every worker and leave no process behind (workers, and what the launcher runs).

        Every call still running in a worker is answered: its worker stops it (SIGKILL to its
        group, then a sweep) and reports its result; if that result does not come through, the
        pool kills the call's processes itself and answers the lease with a ``WorkerGone``
        saying the pool was closed. Calls waiting for a worker get ``WorkerError``. Safe to call
        twice, and from any task (several sessions may share the pool).

        The close unwinds the exit stack start() filled: the workers end (_end_workers), the
        task group ends, the workers left are waited for, the launcher closes, then the socket
        and the private folder go (docs/workers.md, The pool's life). A stop (this task
        cancelled) in one step cuts that step short, never the steps after it.
        """
        if self._state.closes:
            return
        self._state = self._state.closing()
        self._wake_all()
        try:
            await self._stack.aclose()
        finally:
            self._state = self._state.closed()

    async def _end_workers(self) -> None:
        """The close's first step, while the receiver still reads: idle workers are killed at
        once, busy ones asked to stop their call and waited for, and every call answered."""
        leases = [w.lease for w in self._workers.values() if w.lease is not None]
        live = [w for w in self._workers.values() if not w.ended and w.launched is not None]
        busy = [w for w in live if w.lease is not None]
        # Idle workers hold nothing (a call is answered only once its process group is empty):
        # they are ended at once, all together, instead of being asked to exit and waited on
        # through their interpreters' teardown (docs/workers.md, Starting workers).
        idle = [w for w in live if w.lease is None]
        self._kill_all(idle)
        with contextlib.suppress(Exception):
            self.launcher.closing()  # its helpers die beside the workers, not after them
        try:
            await self._shut_down(busy)
        finally:
            # A close cut short (its task cancelled) kills the busy workers it did not stop.
            self._kill_all([w for w in busy if not w.ended])
            self._answer_closed(leases)

    def _kill_all(self, workers: list[_Worker]) -> None:
        """SIGKILL ``workers`` (all together) as the pool closes."""
        for worker in workers:
            worker.killed_on_purpose = True
            worker.kill_reason = worker.kill_reason or POOL_CLOSED
            self._let_go(worker)
        with contextlib.suppress(Exception):
            self.launcher.kill_idle([w.launched for w in workers if w.launched is not None])

    async def _shut_down(self, busy: list[_Worker]) -> None:
        """Ask each busy worker to stop its call and exit, then wait for each."""
        for worker in busy:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send(worker, Shutdown(grace=0.0)), 1.0)
        for worker in busy:
            await self._stop_logged(worker)

    def _answer_closed(self, leases: list[WorkerLease]) -> None:
        """Each worker's exit is handled here rather than by _on_exit (which does nothing once
        the pool closes): a call whose result did not come through (the worker had to be
        killed, or exited first) still gets exactly one answer, once nothing of it is left."""
        for lease in leases:
            if lease._worker.lease is lease and not lease.gone:
                try:
                    self._kill_call_processes(lease)
                except Exception:
                    _log.exception("could not kill the processes of a call of a closed pool")
                lease._answer_gone(POOL_CLOSED, on_purpose=True)

    async def _reap_workers(self) -> None:
        """Once the task group is over (nothing starts any more), every worker left is waited
        for: the idle ones killed first, by now their exits have overlapped the rest; one whose
        start returned during the close, killed as it came. Then what the launcher holds for
        each is given back."""
        try:
            for worker in list(self._workers.values()):
                if not worker.ended and worker.launched is not None:
                    await self._stop_logged(worker)
        finally:
            for worker in list(self._workers.values()):
                self._free(worker)

    async def _close_launcher(self) -> None:
        try:
            await self.launcher.aclose()
        except Exception:
            _log.exception("the worker launcher did not close cleanly")

    async def _stop_logged(self, worker: _Worker) -> None:
        try:
            if worker.launched is not None:
                await self.launcher.stop(worker.launched, self.config.stop_timeout)
        except Exception:  # one worker that will not go must not keep the rest running
            _log.exception("could not stop worker %s", worker.worker_id)
        worker.dead = True
        worker.ended = True
        self._free(worker)

    async def close(self) -> None:
        """The same as :meth:`aclose`."""
        await self.aclose()

    def hide_env(self, names: Iterable[str]) -> None:
        """Keep ``names`` out of this pool's workers too (a session that shares a running pool
        brings its own model's key variable).

        Raises ``WorkerError`` naming the variables (never their values) if the running workers
        already hold one of them (local workers: they are forks of a forkserver exec'd with it,
        and nothing short of a new forkserver takes it out).
        """
        self.hidden_env = self.hidden_env | frozenset(names)
        self.launcher.hide_env(self.hidden_env)

    def _stop_taking_work(self, reason: str) -> None:
        """No more leases: every call waiting for a worker wakes and gets ``WorkerError``."""
        self._state = self._state.stop(reason)
        self._wake_all()

    def _wake_all(self) -> None:
        """The pool takes no more work: whoever waits for a worker, or for starts, stops."""
        self._wake()
        self._first.set()  # start() stops waiting for a worker
        self._settled.set()  # no start is due any more

    @property
    def _stopping(self) -> str | None:
        """Why the pool takes no more work (it closes, or failed), or None while it does."""
        return self._state.stopped

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
            self._demand()
            handle = signal.add_callback(_resolver(waiter)) if signal else None
            try:
                await waiter  # then look again: a worker, the abort, or the close
            finally:
                self._waiters.discard(waiter)
                if handle is not None:
                    handle.remove()

    def _demand(self) -> None:
        """Calls wait for a worker: start one more for each that no start under way will serve,
        up to the pool's size. Once started, a worker stays (and is replaced if it ends)."""
        wanted = min(self._rest_to_start, len(self._waiters) - self._starting)
        for _ in range(max(0, wanted)):
            self._rest_to_start -= 1
            self._start_worker()

    def _start_rest(self) -> None:
        rest, self._rest_to_start = self._rest_to_start, 0
        for _ in range(rest):
            self._start_worker()

    def _release(self, lease: WorkerLease) -> None:
        worker = lease._worker
        if worker.lease is lease:
            worker.lease = None
            if worker.dead or worker.kill_reason is not None or self._stopping is not None:
                return  # gone, or going: never lent again
            if self._exited(worker):
                # Dying: it would fail the next, unrelated call. Retire it; its exit starts a
                # replacement. (andon never signals a healthy worker: a call's stages go to the
                # call's own process group.)
                self._kill(worker, "retired: it is exiting")
                return
            self._idle.append(worker)
            self._wake()

    @staticmethod
    def _exited(worker: _Worker) -> bool:
        """The worker has exited even if its exit callback has not run yet."""
        return worker.launched is not None and worker.launched.has_exited()

    def statistics(self) -> PoolStatistics:
        """The pool's counters now (a copy: it does not change afterwards)."""
        return PoolStatistics(
            self.workers, self._spoofed, tuple(self._error_replies), self._failed_starts.count
        )

    def _tell(self, call: Callable[[], None]) -> None:
        # The observer is the caller's code: what it raises is logged, never the pool's failure.
        try:
            call()
        except Exception:
            _log.exception("the pool's observer raised")

    @property
    def workers(self) -> dict[str, int]:
        """Live workers: id -> pid (on this machine, else in the worker's own namespace)."""
        return {w.worker_id: w.pid for w in self._workers.values() if not w.dead}

    # -- workers ---------------------------------------------------------------------------

    async def _spawn(self) -> _Worker:
        self._remake_runtime()
        self._counter += 1
        worker_id = f"w{self._counter}"
        worker = _Worker(worker_id=worker_id)
        # Known before its launcher returns: a worker may say hello while the engine still
        # answers the start request.
        self._workers[worker_id] = worker
        keys: CurveKeys | None = None
        zap = self._wire.zap if self._wire is not None else None
        if zap is not None and not self.launcher.adopts:
            keys = CurveKeys.generate()
            zap.allow(keys.public)
            self._keys_of[worker_id] = keys.public
        spec = WorkerSpec(
            worker_id=worker_id,
            endpoint=self.endpoint,
            heartbeat_interval=self.config.heartbeat_interval if self.launcher.heartbeats else 0.0,
            server_key=self.server_public_key,
            worker_keys=keys,
        )
        try:
            launched = await self.launcher.start(spec)
        except BaseException:
            self._workers.pop(worker_id, None)
            if keys is not None and zap is not None:
                zap.disallow(keys.public)
                self._keys_of.pop(worker_id, None)
            raise
        if isinstance(launched, AdoptedWorker):
            worker = self._adopt(worker, launched)
        worker.launched = launched
        worker.heard = time.monotonic()
        if isinstance(launched, AdoptedWorker) and not worker.dead:
            hello = launched.arrival.hello
            self._on_hello(worker, hello)  # the hello it was kept with
            if worker.welcomed:
                adopted = worker.worker_id
                self._tell(lambda: self._observer.on_adopted(adopted, hello.host))
        if self._state.closes:  # closed while the engine started it: it is not wanted
            worker.killed_on_purpose = True
            self.launcher.kill(launched)
        launched.exit.add_done_callback(lambda _f: self._on_exit(worker))
        return worker

    def _adopt(self, slot: _Worker, launched: AdoptedWorker) -> _Worker:
        """A start's slot takes the adopted worker's own id (the name it routes by), and that
        id is bound to the key its handshake proved for the worker's life."""
        self._workers.pop(slot.worker_id, None)
        arrival = launched.arrival
        worker = _Worker(worker_id=arrival.worker_id)
        self._workers[worker.worker_id] = worker
        if arrival.key is not None:
            self._keys_of[worker.worker_id] = arrival.key
        return worker

    def _on_stranger(self, worker_id: str, msg: Message, key: bytes | None) -> None:
        """A frame from a worker the pool does not know. A hello under an allowed key is an
        arrival for an adopting launcher (a worker started by hand); anything else is refused
        in one line the worker prints (docs/scale-out.md, Refusals)."""
        if not isinstance(msg, Hello):
            return  # a worker already forgotten (ended, killed): nothing it says is believed
        launcher = self.launcher
        reason: str | None
        if not isinstance(launcher, AdoptLauncher):
            reason = (
                f"this pool knows no worker {worker_id!r}: it starts its own workers and adopts "
                f"none started by hand"
            )
        elif self._stopping is not None:
            reason = f"the pool takes no worker: {self._stopping}"
        elif msg.protocol != PROTOCOL_VERSION:
            reason = (
                f"protocol version mismatch (the worker speaks {msg.protocol}, andon "
                f"{PROTOCOL_VERSION}): run the same andon version on both sides"
            )
        else:
            adopted = sum(1 for w in self._workers.values() if not w.dead and w.launched)
            if adopted + launcher.waiting >= self.config.size:
                reason = f"the pool has all the workers it takes ({self.config.size})"
            else:
                reason = launcher.offer(Arrival(worker_id, msg, key))
                if reason is None and launcher.waiting:
                    # No start was waiting for it: one starts now, instead of leaving the
                    # worker unwelcomed until a call wants it (it would give up first).
                    self._rest_to_start = max(0, self._rest_to_start - 1)
                    self._start_worker()
        if reason is None:
            return
        _log.warning("refused worker %r from %s: %s", worker_id, msg.host, reason)
        self._tell(lambda: self._observer.on_refused(f"worker {worker_id!r}: {reason}"))
        if self._wire is not None:
            with contextlib.suppress(Exception):
                _send_now(self._wire.sock, worker_id.encode(), Refused(reason=reason))

    async def _await_ready(self, worker: _Worker) -> None:
        """Wait for ``worker``'s hello until the start deadline (on the pool's clock); raises
        ``WorkerError`` if it missed it (then it is killed), exited or was refused."""
        waited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        worker.ready.add_done_callback(_resolver(waited))
        deadline = self._clock.monotonic() + self.config.start_timeout
        timer = self._clock.call_at(deadline, lambda: _resolve(waited))
        try:
            await waited
        finally:
            timer.cancel()
        if not worker.ready.done():
            worker.killed_on_purpose = True  # said once, by the start's failure (_start_failed)
            self._kill(worker, "no hello before the start deadline")
            raise _StartFailed(
                f"worker {worker.worker_id} did not say hello within "
                f"{self.config.start_timeout:g}s",
                worker=worker.worker_id,
            )
        worker.ready.result()  # its exit during the start, or its refusal
        self._failing_since = None
        if worker.dead:
            return  # it died right after its hello: its exit started a replacement
        self._idle.append(worker)
        self._wake()
        self._started_one()

    def _start_worker(self) -> None:
        """Start one worker in the background, with retries (it is the pool's own task)."""
        if self._stopping is not None or self._tg is None:
            return
        self._starting += 1
        self._settled.clear()
        self._spawn_task(self._start_with_retries)

    async def _start_with_retries(self) -> None:
        """Start one worker: up to START_ATTEMPTS tries, with back-off between them. Every
        failure is counted (_start_failed); a pool with no worker that keeps failing gives up,
        so that a call waiting for a worker is answered instead of waiting for ever."""
        try:
            for attempt in range(START_ATTEMPTS):
                if attempt:
                    pause = START_BACKOFF[min(attempt - 1, len(START_BACKOFF) - 1)]
                    await self._clock.sleep(pause)  # sleep-ok: back-off between start attempts
                if self._stopping is not None:
                    return
                try:
                    await self._await_ready(await self._spawn())
                    return
                except Exception as e:
                    final = not _retried(e) or attempt == START_ATTEMPTS - 1
                    self._start_failed(e, final=final)
                    if final:
                        return
        finally:
            self._starting -= 1
            if self._starting == 0:
                self._settled.set()
            self._check_starts()

    def _started_one(self) -> None:
        """A worker is ready, or a start failed. Ready: start() may return, and the rest wait to
        be wanted (_demand). Failed with no worker ready: the rest start now, so that the pool
        retries on several fronts (and gives up, _check_starts, only once none is left)."""
        if self._has_ready_worker():
            self._first.set()
        else:
            self._start_rest()

    def _has_ready_worker(self) -> bool:
        return any(w.welcomed and not w.dead for w in self._workers.values())

    def _start_failed(self, error: Exception, *, final: bool) -> None:
        """One failed start: a warning line (at most one per START_WARNING_INTERVAL, the rest
        counted into it), and, with no worker ready for longer than the start deadline, the pool
        gives up (_check_starts)."""
        now = self._clock.monotonic()
        # During the pool's own start, its success is the news, or its error tells the whole
        # story (NoWorkerStarted says how many starts failed and the last reason).
        self._failed_starts.note(_error_text(error), now, quiet=not self._first.is_set())
        if not self._has_ready_worker():
            if self._failing_since is None:
                self._failing_since = now
            if final and not _retried(error):
                # Not a thing a retry changes (a refusal, a bad setting): every start would
                # fail alike, so a pool with no worker stops now.
                self._give_up()
        self._started_one()
        self._check_starts()

    def _check_starts(self) -> None:
        """A pool with no worker ready gives up once no start is under way any more, or once
        its starts have failed for longer than the start deadline: every call waiting for a
        worker gets ``WorkerError`` (``WORKER_LOST``), and so does every later one."""
        if self._stopping is not None or self._has_ready_worker():
            return
        since = self._failing_since
        timed_out = (
            since is not None and self._clock.monotonic() - since >= self.config.start_timeout
        )
        if timed_out or (self._starting == 0 and self._rest_to_start == 0 and since is not None):
            self._give_up()

    def _give_up(self) -> None:
        if self._stopping is None:
            n = self._failed_starts.count
            reason = (
                f"no tool worker could be started ({n} failed start{'s' if n != 1 else ''}; "
                f"the last: {self._failed_starts.last})"
            )
            self._stop_taking_work(reason)  # the calls' results and start()'s error say it

    def _remake_runtime(self) -> None:
        """Re-make the pool's private folder, and its socket in it, if something deleted them
        (a tool's ``rm -rf "$XDG_RUNTIME_DIR"``): a new worker opens its log there and connects
        to the socket. The same path, made afresh with mode 0700; a folder that is there but not
        this user's own private one is refused, never used."""
        if self._wire is None:
            return
        runtime, endpoint = self._wire.runtime, self._wire.endpoint
        try:
            os.makedirs(runtime.parent, mode=0o700, exist_ok=True)
            os.mkdir(runtime, 0o700)
        except FileExistsError:
            info = os.lstat(runtime)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise WorkerError(
                    f"the worker pool's folder {runtime} was replaced by one that is not its own"
                ) from None
        else:
            _log.warning("the worker pool's folder %s was deleted; made it again", runtime)
        if endpoint.startswith("ipc://"):
            path = endpoint.removeprefix("ipc://")
            if not os.path.exists(path):
                # A second bind of the same path: the connected workers keep their connections
                # (an unbind would end them), new ones connect to the new socket file.
                self._wire.sock.bind(endpoint)

    def _on_exit(self, worker: _Worker) -> None:
        """The worker ended, whatever the reason (or it was written off as lost)."""
        if worker.ended:  # written off as lost before: now it has really ended
            self._free(worker)
            return
        worker.dead = True
        was_started = worker.welcomed
        if not worker.ready.done():
            worker.ready.set_exception(
                _StartFailed(
                    f"worker {worker.worker_id} exited during start{_how(worker)}",
                    worker=worker.worker_id,
                )
            )
            worker.ready.exception()  # mark retrieved; the start path reports it
        if self._state.closes:
            return  # the close waits for it and answers its call
        worker.ended = True
        lease = worker.lease
        if lease is not None:
            self._kill_call_processes(lease)
            reason = (
                worker.kill_reason
                or self._stopping
                or (
                    "ended by andon"
                    if worker.killed_on_purpose
                    else f"the worker process died{_how(worker)}"
                )
            )
            lease._answer_gone(reason, worker.killed_on_purpose or self._stopping is not None)
        if worker.launched is not None and worker.launched.has_exited():
            self._free(worker)
        if self._stopping is None and was_started:
            # One that died while it started is its start task's to retry (bounded), not a
            # replacement's: else a start that always fails would be retried for ever.
            self._start_worker()

    def _free(self, worker: _Worker) -> None:
        """Give what the launcher holds for an ended worker back (once), and forget it."""
        if self._workers.get(worker.worker_id) is not worker:
            return
        self._workers.pop(worker.worker_id, None)
        key = self._keys_of.pop(worker.worker_id, None)
        zap = self._wire.zap if self._wire is not None else None
        allowed = self.config.tcp.allowed if self.config.tcp is not None else frozenset()
        if key is not None and zap is not None and key not in allowed:
            # A key made for it dies with it: a stolen one opens nothing. (A key of the
            # allowed list is the user's: a worker started by hand may come back with it.)
            zap.disallow(key)
        if worker.launched is not None:
            with contextlib.suppress(Exception):
                self.launcher.release(worker.launched)

    def _kill_call_processes(self, lease: WorkerLease) -> None:
        """A lost worker's call: what it started is killed where the launcher can reach it
        (local workers: by the call's tag and cgroup, never a group by number)."""
        worker = lease._worker
        if lease.tag is None or worker.launched is None:
            return
        self.launcher.kill_call(worker.launched, lease.tag, lease.started)

    def _kill(self, worker: _Worker, reason: str) -> None:
        if worker.dead or worker.launched is None:
            return
        if not worker.killed_on_purpose:
            _log.warning("killing worker %s: %s", worker.worker_id, reason)
            self._tell(lambda: self._observer.on_broken(worker.worker_id, reason))
        worker.killed_on_purpose = True
        worker.kill_reason = worker.kill_reason or reason
        if worker.lease is not None:
            self._kill_call_processes(worker.lease)
        self._let_go(worker)
        self.launcher.kill(worker.launched)

    def _let_go(self, worker: _Worker) -> None:
        """A worker started by hand is not andon's to signal: it is told to shut down (it kills
        its call and exits), and silence does the rest (it stops at the heartbeat deadline)."""
        if self.launcher.adopts and self._wire is not None and not worker.dead:
            with contextlib.suppress(Exception):
                _send_now(self._wire.sock, worker.worker_id.encode(), Shutdown(grace=0.0))

    def _lose(self, worker: _Worker, reason: str) -> None:
        """The worker fell silent: it is lost now, not when its end can be confirmed (an engine
        that cannot be reached might never confirm it). Its call is answered ``WorkerGone``
        (not on purpose: ``WORKER_LOST``), the launcher's kill is the backstop, and a
        replacement starts."""
        if worker.dead:
            return
        _log.warning("worker %s is lost: %s", worker.worker_id, reason)
        self._tell(lambda: self._observer.on_broken(worker.worker_id, reason))
        worker.kill_reason = reason
        if worker.launched is not None:
            with contextlib.suppress(Exception):
                self.launcher.kill(worker.launched)
        self._on_exit(worker)

    async def _heartbeats(self) -> None:
        """Both ways: a heartbeat to every welcomed worker each interval, and any worker silent
        for longer than the deadline is lost (a worker does the same with the pool)."""
        interval = self.config.heartbeat_interval
        deadline = self.config.heartbeat_deadline
        while self._stopping is None:
            await asyncio.sleep(interval)  # sleep-ok: the heartbeat's own period
            now = time.monotonic()
            for worker in list(self._workers.values()):
                if worker.dead or worker.launched is None:
                    continue
                if worker.ready.done() and now - worker.heard > deadline:
                    self._lose(worker, f"silent for more than {deadline:g}s (heartbeat deadline)")
                elif worker.ready.done():
                    self._spawn_task(self._send, worker, Heartbeat(time=time.time()))

    def _spawn_task(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``fn(*args)`` in the pool's task group. The coroutine is made inside the task, so
        one cancelled before it starts (at the close) leaves no coroutine never awaited."""
        if self._tg is None:  # closed: there is nothing left to do it for
            return
        self._tg.create_task(_never_raises(fn, *args))

    # -- wire ------------------------------------------------------------------------------

    async def _send(self, worker: _Worker, msg: Message | list[bytes]) -> None:
        """Send ``msg`` (or its frames, already encoded) to ``worker``. A message that cannot be
        encoded raises with nothing sent; a transport failure writes the worker off instead."""
        if self._wire is None or worker.dead:
            return
        try:
            await send_routed(
                self._wire.sock,
                worker.worker_id.encode(),
                msg,
                max_bytes=self.config.max_message_bytes,
            )
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

    async def _receive(self, wire: _Wire) -> None:
        sock = wire.sock
        # Over CURVE, who sent a frame is checked against the key its handshake proved.
        curve = wire.zap is not None
        limit = self.config.max_message_bytes
        try:
            while True:
                routed = await recv_routed(sock, limit, read_user_id=curve)
                worker_id = clean_text(routed.identity)
                # Checked before anything is believed: a bad frame under another worker's name
                # must not get that worker killed.
                if curve and not self._sent_by_its_key(worker_id, routed.user_id):
                    continue
                try:
                    self._on_message(worker_id, routed.message, routed.user_id)
                except Exception as e:
                    # A bug handling one message must not end the receiver (every call would
                    # wait forever): the worker it came from is written off, its call answered.
                    _log.exception("could not handle a worker's message")
                    worker = self._workers.get(worker_id)
                    if worker is not None:
                        self._kill(worker, f"andon could not handle its message: {e!r}")
        except Exception as e:
            if self._stopping is None:
                _log.exception("the worker pool's receiver failed")
                self._fail(f"the worker pool failed: its receiver stopped ({e!r})")

    def _sent_by_its_key(self, worker_id: str, user_id: str | None) -> bool:
        """Over CURVE, a worker speaks only under its own name: the key its handshake proved
        (the ZAP user id) must be the key the pool made for that worker id, or, for a worker
        started with keys of its own (``TcpListen.allowed``), one of those. An allowed key never
        lets one worker pass for another."""
        expected = self._keys_of.get(worker_id)
        key = (user_id or "").encode("ascii", "replace")
        tcp = self.config.tcp
        if expected is not None and key == expected:
            return True
        if expected is None and tcp is not None and key in tcp.allowed:
            return True
        self._spoofed += 1
        reason = f"a frame for worker {worker_id!r} came under another key ({key.decode()})"
        _log.warning("dropped %s", reason)
        self._tell(lambda: self._observer.on_refused(reason))
        return False

    def _fail(self, reason: str) -> None:
        """Nothing more can be heard from any worker: take no more work and kill every worker,
        so that each running call is answered (its worker's exit gives it ``WorkerGone``)."""
        self._stop_taking_work(reason)
        for worker in list(self._workers.values()):
            self._kill(worker, reason)

    def _on_message(
        self, worker_id: str, msg: Message | ProtocolError, user_id: str | None = None
    ) -> None:
        worker = self._workers.get(worker_id)
        if isinstance(msg, ProtocolError):
            if worker is not None:
                self._kill(worker, f"sent a bad frame: {msg}")
            return
        if worker is None:
            self._on_stranger(worker_id, msg, user_id.encode("ascii") if user_id else None)
            return
        if worker.dead or worker.kill_reason is not None:
            # A worker already written off: once andon decided to kill a worker, nothing more
            # it says is believed (its call gets WORKER_LOST).
            return
        worker.heard = time.monotonic()
        self._dispatch(worker, msg)

    def _dispatch(self, worker: _Worker, msg: Message) -> None:
        match msg:
            case Hello():
                self._on_hello(worker, msg)
            case _ if msg.type == "heartbeat":
                pass
            case ErrorReply() if msg.call_id is None or worker.lease is None:
                # The answer to a frame that was not about a call: note it, keep the worker.
                _log.warning("worker %s answered an error: %s", worker.worker_id, msg.reason)
                self._error_replies.append((worker.worker_id, msg.reason))
            case _:
                lease = worker.lease
                if lease is None:
                    self._kill(worker, f"sent {msg.type!r} with no call running")
                    return
                if isinstance(msg, Started):
                    lease.started = msg
                lease.messages.put_nowait(msg)
                if isinstance(msg, Result) and self.launcher.heartbeats:
                    # A worker that is stopping (SIGTERM from its engine) exits only once its
                    # result is known to be here: its exit must never overtake its last frame.
                    ack = Ack(call_id=msg.call_id, offset=msg.output_bytes)
                    self._spawn_task(self._send, worker, ack)

    def _on_hello(self, worker: _Worker, msg: Hello) -> None:
        """A worker's hello: welcomed, or refused (another protocol, tools missing) and killed."""
        if msg.protocol != PROTOCOL_VERSION:
            self._spawn_task(self._send, worker, Refused(reason="protocol version mismatch"))
            self._kill(worker, "protocol version mismatch")
            return
        missing = [n for n in self._worker_registry.names if n not in msg.tools]
        if missing:
            # A worker started from another image or install: it would fail the calls
            # of the tools it lacks, one by one. Refused, and the start says why.
            reason = (
                f"worker {worker.worker_id} does not offer the tools "
                f"{', '.join(missing)} (it offers {', '.join(msg.tools) or 'none'}); "
                f"start it with the same tools (andon worker --tools MODULE:NAME)"
            )
            self._spawn_task(self._send, worker, Refused(reason=reason))
            if not worker.ready.done():
                worker.ready.set_exception(WorkerError(reason, worker=worker.worker_id))
                worker.ready.exception()
            self._kill(worker, reason)
            return
        if not worker.ready.done():
            worker.hello_pid = msg.pid
            worker.ready.set_result(msg)
            welcome = Welcome(
                # 0 for local workers: their liveness comes from pidfds
                heartbeat_interval=(
                    self.config.heartbeat_interval if self.launcher.heartbeats else 0.0
                ),
                max_message_bytes=self.config.max_message_bytes,
            )
            self._spawn_task(self._send, worker, welcome)


def _private_folder(parent: str | None) -> tuple[Path, str]:
    """A new private (0700) folder for the pool, and the ipc endpoint of its socket in it: under
    ``parent``, else ``XDG_RUNTIME_DIR``, else the temporary folder."""
    parent = parent or os.environ.get("XDG_RUNTIME_DIR") or None
    if parent is not None and not os.path.isdir(parent):
        parent = None
    # ipc paths must stay under 107 bytes: a short private folder, never a deep test folder.
    runtime = Path(tempfile.mkdtemp(prefix="andon-", dir=parent))
    os.chmod(runtime, 0o700)
    endpoint = f"ipc://{runtime}/pool.sock"
    if len(endpoint) > 100:
        runtime.rmdir()
        runtime = Path(tempfile.mkdtemp(prefix="andon-", dir="/tmp"))
        endpoint = f"ipc://{runtime}/pool.sock"
    return runtime, endpoint


def _stops_asked() -> int:
    """How many cancels of the running task are pending (``Task.cancelling``)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


async def _quietly(close: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``await close()``; what it raises is not the close's failure (a ZAP handler's end)."""
    with contextlib.suppress(Exception):
        await close()


def _tcp_host(address: str, what: str) -> str:
    parts = urlsplit(address)
    if parts.scheme != "tcp" or not parts.hostname:
        raise ConfigError(f"the {what} must look like tcp://HOST:PORT, not {address!r}")
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise ConfigError(f"the {what} {address!r} has a bad port") from None
    return parts.hostname


def _how(worker: _Worker) -> str:
    """``": <how it ended>"`` where its launcher knows (LaunchedWorker.exit_reason), else ""."""
    how = worker.launched.exit_reason if worker.launched is not None else None
    return f": {how}" if how else ""


def _pool_identity() -> str:
    """Unique to one pool on this machine: the pid, the process's start time, the pid namespace
    and a random part (two pools of one process, or two namespaces reusing a pid, never meet)."""
    info, pidns = procs.stat(os.getpid()), procs.pid_namespace()
    start = info.start if info is not None else 0
    return f"{os.getpid()}-s{start}-ns{pidns or 0}-{secrets.token_hex(4)}"


class _FailedStarts:
    """The pool's failed starts (attempts) over its life, and their warning lines: at most one
    per START_WARNING_INTERVAL, the ones in between counted into the next."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""  # the last one's error
        self._unreported = 0  # not yet in a warning line
        self._warned_at: float | None = None

    def note(self, error: str, now: float, *, quiet: bool) -> None:
        """One more, failed with ``error`` at ``now``; ``quiet``: an info line, not a warning."""
        self.count += 1
        self._unreported += 1
        self.last = error
        if quiet:
            _log.info("a tool worker did not start: %s", error)
        elif self._warned_at is None or now - self._warned_at >= START_WARNING_INTERVAL:
            more = f" (and {self._unreported - 1} more)" if self._unreported > 1 else ""
            _log.warning("a tool worker did not start%s: %s", more, error)
            self._warned_at = now
        else:
            return
        self._unreported = 0


class _StartFailed(WorkerError):
    """A worker's start that may succeed when tried again: it missed its hello deadline (a busy
    machine), or it exited while it started (its folder was deleted, the OOM killer)."""


def _handshake_failure(event: int, value: int) -> str:
    """Why a handshake failed, from the pool's side. Which side sees the mismatch first is a
    race: when the client does, it drops the connection, and the pool sees only that (and the
    client, measured, does not come back to fail again)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "it does not speak CURVE (plain tcp: start it with --server-key and --keys)"
        return f"zmq protocol error 0x{value:x}"
    return (
        f"it dropped the connection during the handshake ({os.strerror(value)}): a client "
        f"without CURVE (start it with --server-key and --keys), or not a worker"
    )


def _send_now(sock: zmq.asyncio.Socket, identity: bytes, msg: Message) -> None:
    """Send ``msg`` at once, or not at all (a refusal or a goodbye nobody waits on): through a
    blocking shadow of the socket, in this thread, so a peer that cannot take it raises here
    instead of in a future nobody reads."""
    raw: zmq.Socket[Any] = zmq.Socket.shadow(sock.underlying)
    send_routed_sync(raw, identity, msg, flags=zmq.NOBLOCK)


def _retried(error: Exception) -> bool:
    """A start that failed this way is tried again (up to START_ATTEMPTS): a ``_StartFailed``, or
    the operating system's refusal (a limit reached, a folder deleted). A ``WorkerError`` from the
    launcher (a worker that would hold a key, say) or a refused hello is final: every start would
    fail alike."""
    return isinstance(error, _StartFailed | OSError)


def _error_text(error: Exception) -> str:
    return str(error) if isinstance(error, WorkerError) else f"{type(error).__name__}: {error}"


def _resolver(fut: asyncio.Future[None]) -> Callable[[object], None]:
    def resolve(_cause: object) -> None:
        _resolve(fut)

    return resolve


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _never_raises(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """A pool task's body: a failure is logged, never raised into the pool's task group (which
    would cancel the task that started the pool)."""
    try:
        await fn(*args)
    except Exception:
        _log.exception("a worker pool task failed")
