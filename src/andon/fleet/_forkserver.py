"""Local workers: forks of andon's own forkserver, watched through pidfds.

Workers are forked from a forkserver with the worker modules imported once (a few milliseconds a
worker instead of ~100 ms for a fresh interpreter): a fresh interpreter running
``andon.workers``'s forkserver, reached over a socket pair this process keeps the other end of.
Each request hands it a worker's program and options, the tool registry with them (pickled by
reference, or by value with dill when a tool is defined in a user's script, so it needs no import
path); the answer is the worker's pid and a pidfd of it, opened by its parent, so each worker is
held as a verified pidfd from the moment it exists and is signalled only through it.

No worker holds a model API key (docs/workers.md, Tools): the forkserver is exec'd without
them, and the workers and call processes are forks of it. Nothing else is started: no resource
tracker, no file on disk (a tool's ``rm -rf /tmp/*`` cannot cut the pool off its forkserver).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal as _signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Final

from andon import procs
from andon.base import Containment, ContainmentSetting, WorkerError, clean_text
from andon.fleet._launch import (
    LaunchedWorker,
    PidfdWorker,
    PoolSetup,
    WorkerLauncher,
    WorkerSpec,
)
from andon.fleet._spawner import STOP_SIGNALS, dying_with_this_thread, in_spawner
from andon.protocol import Started
from andon.workers import (
    FORKSERVER_MODULE,
    CgroupTree,
    WorkerOptions,
    cgroup2_root,
    detect_mode,
    dump_request,
    read_reply,
    worker_main,
    write_request,
)

__all__ = ["ForkserverLauncher"]

_PRELOAD = ["andon.workers"]
_log = logging.getLogger("andon.pool")


class _LocalWorker(PidfdWorker):
    def describe(self) -> str:
        return f"worker {self.worker_id} (pid {self.pid})"


@dataclasses.dataclass(frozen=True)
class _Forked:
    """What the forkserver forked for one start: the worker's pid and its pidfd (None when it
    had already exited and been reaped by the time the answer was read: gone)."""

    pid: int
    handle: procs.Pidfd | None


class ForkserverLauncher(WorkerLauncher):
    """Today's local workers. ``containment`` forces a mode (tests cover all three)."""

    transport = "ipc"
    heartbeats = False
    local_processes = True
    lost_call_note = "andon killed the call's processes"

    def __init__(self, containment: ContainmentSetting = "auto") -> None:
        self.containment: Containment = detect_mode(containment)
        self._setup: PoolSetup | None = None
        self._hidden: frozenset[str] = frozenset()
        self._registry: Any = None
        self._cgroups: CgroupTree | None = None
        self._held = False
        # Starts cancelled while their thread still ran (the pool closed, a signal): what each
        # forked is killed when it ends, and the close waits for them (ABANDONED_WAIT).
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def open(self, setup: PoolSetup) -> None:
        self._setup = setup
        self._hidden = setup.hidden_env
        self._registry = setup.registry
        if self.containment == "cgroup":
            root = cgroup2_root()
            if root is not None:
                CgroupTree.sweep_stale(root)
                # Random per pool: two pools in one process never share a tree.
                self._cgroups = CgroupTree.new(root, os.getpid())
                self._cgroups.create_base()
        _ForkserverUsers.acquire()
        self._held = True

    def hide_env(self, names: Iterable[str]) -> None:
        self._hidden = self._hidden | frozenset(names)
        held = _forkserver_holds(self._hidden)
        if held:
            raise WorkerError(_holds_message(held))

    def worker_program(self) -> Callable[[WorkerOptions], object]:
        """What the next worker runs, given its options: andon's worker. A test's launcher
        gives one that breaks the protocol on purpose; it is pickled (by reference) into the
        forked worker, so it must be importable there."""
        return worker_main

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        setup = self._setup
        assert setup is not None, "open() first"
        worker_id = spec.worker_id
        program = self.worker_program()
        options = WorkerOptions(
            endpoint=spec.endpoint,
            worker_id=worker_id,
            registry=self._registry,
            supervisor_pid=os.getpid(),
            supervisor_start=_own_start(),
            containment=self.containment,
            log_path=str(setup.runtime_dir / f"{worker_id}.log"),
            cgroup_base=str(self._cgroups.base) if self._cgroups is not None else None,
            max_message_bytes=setup.max_message_bytes,
        )

        def request_for(server: _Forkserver) -> bytes:
            # Made under _START_LOCK right before it is sent: the forkserver it goes to is the
            # worker's parent (a worker checks that it still is, and that it lives).
            return dump_request(program, dataclasses.replace(options, forkserver_pid=server.pid))

        _ensure_forkserver(self._hidden)
        try:
            forked = await _started(request_for, self._abandoned)
        except _UNREACHABLE as error:
            # It ended (before it forked the worker, or as it started), or stopped answering:
            # a new forkserver, and once more.
            ended = await _forkserver_ended(error)
            if ended is None:
                _log.warning("the workers' forkserver stopped answering; starting a new one")
            else:
                _log.info("the workers' forkserver ended (%s); starting a new one", ended)
            _restart_forkserver(self._hidden)
            try:
                forked = await _started(request_for, self._abandoned)
            except _UNREACHABLE as again:
                ended = await _forkserver_ended(again)
                if ended is None:
                    raise
                # Twice in a row: an interpreter that cannot start here (a broken
                # sitecustomize, say). Every start would fail alike: final, said plainly.
                raise WorkerError(
                    f"the workers' forkserver ended as it started, twice ({ended})",
                    worker=worker_id,
                ) from again
        return _LocalWorker(worker_id, forked.pid, forked.handle)

    def kill(self, worker: LaunchedWorker) -> None:
        assert isinstance(worker, _LocalWorker)
        if worker.handle is not None:
            procs.signal_group(worker.handle, _signal.SIGKILL)

    def kill_idle(self, workers: Iterable[LaunchedWorker]) -> None:
        """SIGKILL idle workers and whatever joined their process groups or cgroups. In cgroup
        mode a worker's leaf holds the worker and anything that slipped into its group, and
        ``cgroup.kill`` needs no scan of ``/proc`` (a few ms on a busy machine); otherwise one
        scan serves every worker."""
        local = [w for w in workers if isinstance(w, _LocalWorker)]
        handles = [w.handle for w in local if w.handle is not None]
        if self._cgroups is None:
            procs.signal_groups(handles, _signal.SIGKILL)
            return
        for handle in handles:
            handle.send(_signal.SIGKILL)
        for worker in local:
            leaf = self._cgroups.base / f"worker-{worker.worker_id}"
            if leaf.is_dir():
                CgroupTree.kill(leaf)

    def kill_call(self, worker: LaunchedWorker, tag: str, started: Started | None) -> None:
        """SIGKILL every process carrying the call's tag, and its cgroup when it is a leaf of
        this pool's own tree. Never a group by number: the worker that pinned it is gone."""
        cgroup = Path(started.cgroup) if started is not None and started.cgroup else None
        if cgroup is None and self._cgroups is not None:
            # Lost before its ``started`` arrived: the leaf's name is known from the tag alone
            # (the worker names it so), and this pool's own tree is the only place it can be.
            cgroup = self._cgroups.base / f"call-{tag}"
        owned = cgroup is not None and self._cgroups is not None and self._cgroups.owns(cgroup)
        leader = (
            procs.ProcessKey.from_create_time(started.pid, started.create_time)
            if started is not None
            else None
        )
        procs.kill_call(
            procs.CallIdentity(tag, leader, cgroup if owned else None), cgroup_owned=owned
        )

    def release(self, worker: LaunchedWorker) -> None:
        assert isinstance(worker, _LocalWorker)
        worker.close_handle()  # the forkserver, its parent, reaps it

    def closing(self) -> None:
        """The last open pool's close SIGKILLs the forkserver right away: it starts no worker
        any more, and its exit overlaps the workers' (aclose reaps it)."""
        if self._held and _ForkserverUsers.count == 1:
            server = _Forkserver.current
            if server is not None:
                procs.kill_child(server.pid, _signal.SIGKILL)

    @staticmethod
    def prestart(hidden: Iterable[str]) -> None:
        """Start the forkserver now, before any pool asks for it, without the variables in
        ``hidden``: ``andon run`` does so first thing, so that the forkserver's interpreter
        starts while the command imports and parses (docs/workers.md, Starting workers). A pool
        that needs another variable hidden replaces it, as it has forked nothing yet; one that
        no pool took is stopped by :meth:`stop_unused`."""
        _ensure_forkserver(frozenset(hidden))

    @staticmethod
    def leaving() -> None:
        """This process exits as soon as its pools are closed (``andon run``, once its job is
        over): the last pool's close SIGKILLs the forkserver without waiting to reap it (a
        couple of milliseconds on every exit, while its interpreter's memory is freed). Safe
        because nothing follows: no log write, no other pool; the forkserver holds nothing, and
        its pid is not reused before whoever reaps this process's orphans reaps it."""
        _ForkserverUsers.leaving = True

    @staticmethod
    def stop_unused() -> None:
        """Stop (SIGKILL and reap) the forkserver if no pool uses it: a prestarted one that no
        pool took (the command ended early, or its workers run elsewhere)."""
        _ForkserverUsers.stop_if_unused()

    async def aclose(self) -> None:
        if self._held:
            self._held = False
            _ForkserverUsers.release()  # the last pool's: the forkserver goes, and the wait ends
        if self._abandoned:
            # A start cancelled while its thread waited on the forkserver may still fork a
            # worker: nothing of the pool would know it, and it would outlive the close. Its
            # thread ends soon (the forkserver answers, or is gone); what it forked is killed.
            pending = set(self._abandoned)
            await asyncio.wait(pending, timeout=ABANDONED_WAIT)
            for future in pending:
                if future.done():
                    _kill_unwanted(future)
                else:
                    _log.warning("a cancelled worker start did not end within %gs", ABANDONED_WAIT)
            _ForkserverUsers.stop_if_unused()
        if self._cgroups is not None:
            self._cgroups.remove_all()
            self._cgroups = None


_START_LOCK: Final = threading.Lock()
"""One worker start at a time: a request and its answer share the one connection to the
forkserver, and nothing else reads or closes it meanwhile."""


ABANDONED_WAIT: Final = 10.0
"""Seconds a launcher's close waits for the thread of a cancelled start (it waits on the
forkserver, which answers in a moment, or is gone and fails it at once)."""


async def _started(
    request_for: Callable[[_Forkserver], bytes], abandoned_starts: set[asyncio.Future[Any]]
) -> _Forked:
    """A new worker process, started off the event loop.

    The answer comes once the forkserver has forked the worker, and a forkserver just spawned
    answers only once it has imported the worker modules: seconds on a busy machine. On the loop,
    that wait would hold back every signal's handling, and a stop during the pool's start with
    it. In a thread, the start can be cancelled at once; the pool's close then kills the
    forkserver (which ends the wait), and a worker that was forked all the same is killed here,
    as unwanted."""
    abandoned = threading.Event()
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, _start_process, request_for, abandoned)
    try:
        forked = await asyncio.shield(future)
    except asyncio.CancelledError:
        abandoned.set()  # a start still waiting for its turn does not begin
        future.add_done_callback(_kill_unwanted)
        if not future.done():
            abandoned_starts.add(future)  # the launcher's close waits for it
            future.add_done_callback(abandoned_starts.discard)
        raise
    assert forked is not None  # only an abandoned start gives none
    return forked


def _start_process(
    request_for: Callable[[_Forkserver], bytes], abandoned: threading.Event
) -> _Forked | None:
    with _START_LOCK:
        if abandoned.is_set():
            return None
        server = _Forkserver.current
        if server is None or not server.running() or not server.begin_use():
            # Gone since it was started (a pool's close killed it, say). Never respawned from
            # here: only _ensure_forkserver starts one, scrubbed, from the spawner thread.
            raise ConnectionRefusedError("the workers' forkserver is not running")
        try:
            server.asked += 1
            write_request(server.sock, request_for(server))
            reply = read_reply(server.sock)
        finally:
            server.end_use()
    if reply.error:
        reason = os.strerror(reply.error)
        raise OSError(reply.error, f"the workers' forkserver could not fork a worker: {reason}")
    handle = None
    if reply.fd is not None:
        # Opened by the worker's parent before it could reap it: this very process.
        handle = procs.Pidfd(reply.fd, procs.ProcessKey(reply.pid, reply.start))
    return _Forked(reply.pid, handle)


def _kill_unwanted(future: asyncio.Future[Any]) -> None:
    """Kill the worker a cancelled start forked, if it forked one (safe to call twice: the
    first closes its pidfd)."""
    if future.cancelled() or future.exception() is not None:
        return  # nothing was forked (the exception is read: it is not worth a warning)
    forked: _Forked | None = future.result()
    if forked is None or forked.handle is None or forked.handle.fd < 0:
        return
    with forked.handle as handle:
        procs.signal_group(handle, _signal.SIGKILL)


class _Forkserver:
    """The running forkserver: this process's unreaped child (so its pid cannot be reused until
    it is reaped here) and this process's end of the socket pair to it."""

    current: ClassVar[_Forkserver | None] = None

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.pid = process.pid
        self.sock = sock
        self.closed = False
        self.asked = 0  # requests sent: one never asked holds nothing anyone uses
        self._lock = threading.Lock()
        self._users = 0

    def running(self) -> bool:
        return not self.closed and procs.child_running(self.pid)

    def begin_use(self) -> bool:
        """A start is about to use the socket (False: it is being stopped)."""
        with self._lock:
            if self.closed:
                return False
            self._users += 1
            return True

    def end_use(self) -> None:
        with self._lock:
            self._users -= 1
            if self.closed and self._users == 0:
                self.sock.close()  # its stop left the close to the start that used it

    def stop(self, *, reap: bool = True) -> None:
        """SIGKILL and reap it, and let go of the socket. A start waiting on the socket in its
        thread gets end of file at once (``shutdown``; a close would not wake it) and closes the
        socket once it is done with it. ``reap=False``: this process exits next, and whoever
        reaps its orphans reaps the forkserver (SIGKILLed, it does nothing more, and its pid
        stays its own until it is reaped)."""
        with self._lock:
            self.closed = True
            unused = self._users == 0
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            if unused:
                self.sock.close()
        procs.kill_child(self.pid, _signal.SIGKILL)
        if reap:
            self.process.wait()


def _ensure_forkserver(hidden: frozenset[str]) -> None:
    """Start the forkserver, if it is not running, from a scrubbed environment: without any
    variable in ``hidden`` (or hidden by an earlier pool of this process), and with
    ``ANDON_CALL_TAG`` holding a slot.

    Workers and their Python call processes are forks of it, never exec'd: the environment
    ``/proc`` shows for them is the one the forkserver was exec'd with, whatever their
    ``os.environ`` says later. So the keys are left out of the environment it is exec'd with;
    this process keeps its own keys, which its model needs. The slot is the room a call process
    writes its call's tag into (:func:`andon.procs.stamp_tag`), so it carries the tag like every
    process a shell call starts.

    The forkserver is one per process, shared by every pool. One already running whose
    environment holds a variable in ``hidden`` (a later pool brought a key variable the first did
    not hide) cannot be replaced while workers of it live (each holds it open), so this refuses
    with ``WorkerError`` rather than start a worker that holds a key.
    """
    _Scrub.names |= hidden
    held = _forkserver_holds(hidden)
    server = _Forkserver.current
    if held and server is not None and server.asked == 0:
        # Started ahead (ForkserverLauncher.prestart) and never asked for a worker: no process
        # holds what it holds, so it is replaced rather than refused.
        server.stop()
        _Forkserver.current = server = None
    elif held:
        raise WorkerError(_holds_message(held))
    if server is not None:
        if server.running():
            return  # running, and clean of every name asked for
        server.stop()  # ended (a tool killed it, say): reaped before a new one starts
        _Forkserver.current = None
    env = {k: v for k, v in os.environ.items() if k not in _Scrub.names}
    env[procs.TAG_VAR] = procs.TAG_SLOT
    # The forkserver lives in the supervisor's process group, where a CI runner's
    # SIGINT/SIGTERM/SIGHUP to the whole group also lands: one that dies of it (or prints a
    # KeyboardInterrupt while its interpreter starts) takes the pool's start with it. Spawned
    # with those signals blocked, it keeps them blocked for life; the workers, forks of it,
    # unblock every signal once they have their own session (workers/_main.py). It is spawned
    # from a thread of its own (andon.fleet._spawner): andon's own signals stay in order, and a
    # kill -9 of andon takes it down with it.
    in_spawner(lambda: _spawn(env))


def _spawn(env: dict[str, str]) -> None:
    """On the spawner thread (``andon.fleet._spawner``: the stop signals blocked there only,
    and what it spawns dies with it, that is with this process)."""
    if _SpawnWindow.hook is not None:
        _SpawnWindow.hook()
    _signal.pthread_sigmask(_signal.SIG_BLOCK, STOP_SIGNALS)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        code = f"from {FORKSERVER_MODULE} import serve; serve()"
        argv = [
            sys.executable,
            *subprocess._args_from_interpreter_flags(),  # type: ignore[attr-defined]
            "-c",
            code,
            str(theirs.fileno()),
            *_PRELOAD,
        ]
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            preexec_fn=dying_with_this_thread(),
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()  # its copy is the forkserver's: at our end's close it sees end of file
    _Forkserver.current = _Forkserver(process, ours)


def _restart_forkserver(hidden: frozenset[str]) -> None:
    """Replace a forkserver that ended or stopped answering: SIGKILLed and reaped, then
    started afresh, scrubbed as always. The workers it forked are independent of it and keep
    running."""
    server = _Forkserver.current
    if server is not None:
        server.stop()
        _Forkserver.current = None
    _ensure_forkserver(hidden)


_UNREACHABLE: Final = (ConnectionError, EOFError)
"""How a worker's start fails when the forkserver cannot be reached: it is not running
(``ConnectionRefusedError``), or it ended before it answered (``EOFError``, a reset or a broken
pipe)."""


async def _forkserver_ended(error: BaseException) -> str | None:
    """How the forkserver ended ("exit status 1"), or None when it still runs (it stopped
    answering).

    A dropped connection means it is ending: its socket closes as it exits, a moment before
    its exit can be seen, so that moment is waited for (on the loop, at most
    ``FORKSERVER_EXIT_WAIT``)."""
    server = _Forkserver.current
    if server is None or server.closed:
        return "it was not running"
    pid = server.pid
    ended = procs.child_ended(pid)
    if ended is not None:
        return ended
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return procs.child_ended(pid)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, readable)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited, FORKSERVER_EXIT_WAIT)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return procs.child_ended(pid)


FORKSERVER_EXIT_WAIT: Final = 10.0
"""Seconds a failed start waits for a forkserver that dropped its connection to be seen to exit
(a moment; far longer only on a machine too loaded to schedule it)."""


def _own_start() -> int | None:
    """This process's start time (clock ticks since boot), for the workers' watch of it."""
    info = procs.stat(os.getpid())
    return info.start if info is not None else None


class _SpawnWindow:
    """Tests only: ``hook`` runs inside the spawn window, with the stop signals blocked, to hold
    it open while a test signals (tests/cli/slow_start.py)."""

    hook: ClassVar[Callable[[], None] | None] = None


class _Scrub:
    """Every variable a pool of this process asked to hide: a forkserver started (or restarted)
    for any pool leaves them all out, so it suits every pool already open."""

    names: frozenset[str] = frozenset()


def _forkserver_pid() -> int | None:
    """The running forkserver's pid, or None. Never reaps it: it is this process's unreaped
    child, so the pid cannot be reused."""
    server = _Forkserver.current
    return server.pid if server is not None and server.running() else None


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
    present = {clean_text(entry.partition(b"=")[0]) for entry in block.split(b"\0")}
    return sorted(present & names)


def _holds_message(held: list[str]) -> str:
    shown = ", ".join(f"${name}" for name in held)
    return (
        f"the workers' forkserver, shared by this process's worker pools, was started with "
        f"{shown} in its environment, so a tool could read it; close the other pools first "
        f"(a new forkserver starts without it), or give the first pool hide_env=[...] naming it"
    )


class _ForkserverUsers:
    """The forkserver is a per-process singleton: the last pool to close stops it, so a closed
    pool leaves no helper process behind.

    Stopped with SIGKILL, then reaped: it holds nothing by then (it only forks workers, and none
    is being started once the last pool closed), and a kill costs no interpreter teardown on the
    exit path of every ``andon run``."""

    count = 0
    leaving = False  # the process exits once its pools are closed (ForkserverLauncher.leaving)

    @classmethod
    def acquire(cls) -> None:
        cls.count += 1

    @classmethod
    def release(cls) -> None:
        cls.count -= 1
        cls.stop_if_unused()

    @classmethod
    def stop_if_unused(cls) -> None:
        """Stop the forkserver if no pool uses it (again, after the thread of a cancelled start
        ended)."""
        if cls.count > 0:
            return
        server = _Forkserver.current
        if server is not None:
            _Forkserver.current = None
            server.stop(reap=not cls.leaving)
