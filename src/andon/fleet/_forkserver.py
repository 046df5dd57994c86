"""Local workers: forks of one ``multiprocess`` forkserver, watched through pidfds.

Workers are started through a forkserver with the worker modules preloaded (a few milliseconds a
worker instead of ~100 ms for a fresh interpreter); the forkserver also hands each worker the tool
registry (pickled with dill, so a tool defined in a user's script needs no import path). Each worker
is held as a verified pidfd from the moment it exists and is signalled only through it.

No worker holds a model API key (docs/workers.md, Tools): the forkserver is exec'd without
them, and the workers and call processes are forks of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal as _signal
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Final

import multiprocess
import multiprocess.context
from multiprocess import popen_forkserver, spawn

from andon import procs
from andon.base import Containment, ContainmentSetting, WorkerError, clean_text
from andon.fleet._launch import (
    LaunchedWorker,
    PidfdWorker,
    PoolSetup,
    WorkerLauncher,
    WorkerSpec,
)
from andon.fleet._spawner import STOP_SIGNALS, in_spawner
from andon.protocol import Started
from andon.workers import (
    CgroupTree,
    WorkerOptions,
    cgroup2_root,
    detect_mode,
    worker_main,
)

__all__ = ["ForkserverLauncher"]

_PRELOAD = ["andon.workers"]
_log = logging.getLogger("andon.pool")


class _LocalWorker(PidfdWorker):
    def __init__(self, worker_id: str, process: Any, handle: procs.Pidfd | None) -> None:
        super().__init__(worker_id, process.pid, handle)
        self.process = process  # multiprocess.Process

    def describe(self) -> str:
        return f"worker {self.worker_id} (pid {self.pid})"


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
        multiprocess.get_context("forkserver").set_forkserver_preload(_PRELOAD)
        _ForkserverUsers.acquire()
        self._held = True

    def hide_env(self, names: Iterable[str]) -> None:
        self._hidden = self._hidden | frozenset(names)
        held = _forkserver_holds(self._hidden)
        if held:
            raise WorkerError(_holds_message(held))

    def worker_program(self) -> Callable[[WorkerOptions], None]:
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

        def process_of() -> _WorkerProcess:
            # Called under _START_LOCK right before the fork: the forkserver running now is the
            # worker's parent (a dead one is never respawned from there).
            forked_by = dataclasses.replace(options, forkserver_pid=_forkserver_pid())
            name = f"andon-worker-{worker_id}"
            return _WorkerProcess(target=program, args=(forked_by,), name=name, daemon=True)

        _ensure_forkserver(self._hidden)
        try:
            process = await _started(process_of, self._abandoned)
        except _UNREACHABLE as error:
            # Its listening socket is gone (multiprocess keeps it in the temporary folder, which a
            # tool's ``rm -rf /tmp/*`` empties), or it ended (before it forked the worker, or as
            # it started): a new forkserver, and once more.
            ended = await _forkserver_ended(error)
            if ended is None:
                _log.warning("the workers' forkserver lost its socket; starting a new one")
            else:
                _log.info("the workers' forkserver ended (%s); starting a new one", ended)
            _restart_forkserver(self._hidden)
            try:
                process = await _started(process_of, self._abandoned)
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
        # multiprocess restarts a forkserver that died between the check above and the start
        # (from the environment as it is then, keys and all): the worker is looked at, not
        # trusted, and one that would hold a key never gets a call.
        held = _forkserver_holds(self._hidden)
        info = procs.stat(process.pid)
        # The worker is the forkserver's child, so nothing of ours pins its pid: hold it as a
        # verified pidfd from the start, and signal it only through that.
        handle = procs.Pidfd.open(info.key, zombie_ok=True) if info is not None else None
        if held and handle is not None:
            procs.signal_group(handle, _signal.SIGKILL)
            handle.close()
            with contextlib.suppress(Exception):
                process.join(5.0)
            raise WorkerError(_holds_message(held), worker=worker_id)
        return _LocalWorker(worker_id, process, handle)

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
        with contextlib.suppress(Exception):
            worker.process.join(0)
        worker.close_handle()

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
            _ForkserverUsers.stop_if_unused()  # what such a thread respawned, if anything
        if self._cgroups is not None:
            self._cgroups.remove_all()
            self._cgroups = None


_START_LOCK: Final = threading.Lock()
"""One worker start at a time: each swaps a function of ``multiprocess.spawn`` while it runs."""


ABANDONED_WAIT: Final = 10.0
"""Seconds a launcher's close waits for the thread of a cancelled start (it waits on the
forkserver, which answers in a moment, or is gone and fails it at once)."""


async def _started(
    process_of: Callable[[], Any], abandoned_starts: set[asyncio.Future[Any]]
) -> Any:
    """A new worker process, started off the event loop.

    ``start`` waits until the forkserver has forked the worker, and a forkserver just spawned
    answers only once it has imported the worker modules: seconds on a busy machine. On the loop,
    that wait would hold back every signal's handling, and a stop during the pool's start with
    it. In a thread, the start can be cancelled at once; the pool's close then kills the
    forkserver (which ends the wait), and a worker that was forked all the same is killed here,
    as unwanted."""
    abandoned = threading.Event()
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, _start_process, process_of, abandoned)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        abandoned.set()  # a start still waiting for its turn does not begin
        future.add_done_callback(_kill_unwanted)
        if not future.done():
            abandoned_starts.add(future)  # the launcher's close waits for it
            future.add_done_callback(abandoned_starts.discard)
        raise


def _start_process(process_of: Callable[[], Any], abandoned: threading.Event) -> Any:
    with _START_LOCK:
        if abandoned.is_set():
            return None
        if _forkserver_pid() is None:
            # Gone since it was started (a pool's close killed it, say). Never from here:
            # multiprocess would spawn a new one from this thread, with the environment as it is
            # (keys and all), the stop signals unblocked and no parent-death signal.
            raise ConnectionRefusedError("the workers' forkserver is not running")
        process = process_of()
        process.start()
        return process


def _kill_unwanted(future: asyncio.Future[Any]) -> None:
    """Kill the worker a cancelled start forked, if it forked one (safe to call twice)."""
    if future.cancelled() or future.exception() is not None:
        return  # nothing was forked (the exception is read: it is not worth a warning)
    process = future.result()
    if process is None:
        return
    info = procs.stat(process.pid)
    handle = procs.Pidfd.open(info.key, zombie_ok=True) if info is not None else None
    if handle is not None:
        with handle:
            procs.signal_group(handle, _signal.SIGKILL)


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
    into (:func:`andon.procs.stamp_tag`), so it carries the tag like every process a shell
    call starts.

    The forkserver is one per process, shared by every pool. One already running whose
    environment holds a variable in ``hidden`` (a later pool brought a key variable the first did
    not hide) cannot be replaced while workers of it live (each holds it open), so this refuses
    with ``WorkerError`` rather than start a worker that holds a key.
    """
    _Scrub.names |= hidden
    held = _forkserver_holds(hidden)
    if held:
        raise WorkerError(_holds_message(held))
    if _forkserver_pid() is not None:
        return  # running, and clean of every name asked for
    names = (procs.TAG_VAR, *sorted(_Scrub.names))
    # The forkserver (and multiprocess's resource tracker, started with it) live in the
    # supervisor's process group, where a CI runner's SIGINT/SIGTERM/SIGHUP to the whole group
    # also lands: one that dies of it (or prints a KeyboardInterrupt while its interpreter
    # starts) takes the pool's start with it. Spawned with those signals blocked, they keep them
    # blocked for life (neither unblocks them); the workers, forks of it, unblock every signal
    # once they have their own session (workers/_main.py). They are spawned from a thread of
    # their own (andon.fleet._spawner): andon's own signals stay in order, and a kill -9 of
    # andon takes both down with it.
    _short_temp_dir()
    saved = {name: os.environ.get(name) for name in names}
    try:
        for name in _Scrub.names:
            os.environ.pop(name, None)
        os.environ[procs.TAG_VAR] = procs.TAG_SLOT
        in_spawner(_spawn_helpers)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _spawn_helpers() -> None:
    """On the spawner thread (``andon.fleet._spawner``: the stop signals blocked there only,
    and the helpers die with it, that is with this process)."""
    from multiprocess import forkserver, resource_tracker

    if _SpawnWindow.hook is not None:
        _SpawnWindow.hook()
    # The resource tracker blocks SIGINT/SIGTERM around its own spawn and *unblocks* them on
    # its way out; started first, on its own, it cannot unblock them under the forkserver.
    resource_tracker.ensure_running()
    _signal.pthread_sigmask(_signal.SIG_BLOCK, STOP_SIGNALS)
    forkserver.ensure_running()


_SUN_PATH_MAX = 107
"""Bytes an ``AF_UNIX`` socket path may have on Linux (``sun_path`` holds 108, with its NUL)."""
_LISTENER_NAME = len("/listener-") + 8
"""What multiprocess adds to its temporary folder for the forkserver's socket
(``tempfile.mktemp(prefix="listener-")``: eight random characters)."""


def _short_temp_dir() -> None:
    """Give multiprocess a temporary folder short enough for the forkserver's socket.

    multiprocess makes its folder under ``$TMPDIR`` once and puts the forkserver's socket in it. A
    CI runner's deep workspace ``TMPDIR`` makes that path longer than ``AF_UNIX`` allows, and then
    no worker could ever start ("AF_UNIX path too long"): a private folder under ``/tmp`` serves
    instead, as the pool's own socket folder does (``WorkerPool._start``)."""
    from multiprocess import process, util

    folder = util.get_temp_dir()
    if len(os.fsencode(folder)) + _LISTENER_NAME <= _SUN_PATH_MAX:
        return
    short = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    # Removed at exit as multiprocess removes its own (what it made under TMPDIR is left to it).
    util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
    process.current_process()._config["tempdir"] = short


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


_UNREACHABLE: Final = (ConnectionError, FileNotFoundError, EOFError)
"""How a worker's start fails when the forkserver cannot be reached: its socket is gone
(``FileNotFoundError``), nothing listens on it any more (``ConnectionRefusedError``), or it ended
after it took the connection (``EOFError``, a reset or a broken pipe)."""


async def _forkserver_ended(error: BaseException) -> str | None:
    """How the forkserver ended ("exit status 1"), or None when it runs and only its socket was
    lost (deleted from the temporary folder).

    A refused or dropped connection means it is ending: its sockets close as it exits, a moment
    before its exit can be seen, so that moment is waited for (on the loop, at most
    ``FORKSERVER_EXIT_WAIT``)."""
    from multiprocess import forkserver

    pid: int | None = forkserver._forkserver._forkserver_pid
    if pid is None:
        return "it was not running"
    if isinstance(error, FileNotFoundError) and procs.child_running(pid):
        return None
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
"""Seconds a failed start waits for a forkserver that refused or dropped its connection to be
seen to exit (a moment; far longer only on a machine too loaded to schedule it)."""


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
        cls.stop_if_unused()

    @classmethod
    def stop_if_unused(cls) -> None:
        """Stop the forkserver and the tracker if no pool uses them (again, after the thread of
        a cancelled start ended: multiprocess respawns either from the thread that starts a
        worker when it finds it gone, and such a late start must not leave one running)."""
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
