"""The worker process: one tool call at a time, reached over a ZeroMQ DEALER socket.

Start-up (docs/workers.md, Starting workers): become a child subreaper, leave the terminal's
session, reset every signal disposition (a CI script may have started andon with SIGINT ignored),
point fds 0/1/2 at /dev/null and a worker log (a Python tool's ``print`` must never reach the
supervisor's stdout), then say ``hello``. If the supervisor disappears, the worker SIGKILLs its
call's processes at once and exits: no tool keeps writing after its log stopped. A local worker
learns it from a pidfd on the supervisor; a worker elsewhere (a container, another host) from the
supervisor's heartbeats stopping for longer than the deadline, and it gives up if no ``welcome``
comes at all.

As a program (``andon worker --connect``, a container's main process), the worker also handles
SIGTERM and SIGINT: it drains its call on the call's own grace timeline, sends the result, and
exits. A container's PID 1 ignores every signal it has no handler for, so without this an engine's
stop would always wait its full timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from andon import procs
from andon.base import (
    ArmTimer,
    BeginStop,
    Containment,
    ContainmentSetting,
    GraceLadder,
    LadderEvent,
    ProtocolError,
    Running,
    SendStage,
    Tick,
    Timeline,
)
from andon.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Cancel,
    CurveKeys,
    ErrorReply,
    Heartbeat,
    Hello,
    Message,
    Refused,
    Run,
    Shutdown,
    Welcome,
    curve_client,
    recv_message,
    send_message,
)
from andon.workers._calls import (
    CallContext,
    internal_error_result,
    kill_everything,
    retire_spare,
    run_call,
)
from andon.workers._containment import (
    CgroupTree,
    cgroup2_root,
    detect_mode,
    set_child_subreaper,
    set_parent_death_signal,
)
from andon.workers._pycall import Spare
from andon.workers._reaper import Reaper
from andon.workers._registry import ToolRegistry

__all__ = ["Worker", "WorkerOptions", "leave_session_and_reset_signals", "worker_main"]


@dataclass(frozen=True)
class WorkerOptions:
    endpoint: str
    worker_id: str
    registry: ToolRegistry
    supervisor_pid: int | None = None  # local workers watch it with a pidfd
    # Its start time (clock ticks since boot): a supervisor killed while this worker started may
    # have its pid reused by then, and a stranger must not be taken for it.
    supervisor_start: int | None = None
    # The forkserver that forks this worker (local workers): its parent until it watches the
    # supervisor. One already gone when the worker looks (killed by a pool's close while it
    # forked this one) is a start nobody waits for any more.
    forkserver_pid: int | None = None
    containment: ContainmentSetting = "auto"
    log_path: str | None = None
    cgroup_base: str | None = None  # the pool's own cgroup tree (cgroup mode)
    max_message_bytes: int = 16 * 1024 * 1024
    linger_ms: int = 500
    # tcp + CURVE: the supervisor's public key and this worker's keys (on its allow-list).
    server_key: bytes | None = None
    curve: CurveKeys | None = field(default=None, repr=False)
    # Workers elsewhere: exit if no welcome comes within this many seconds (the supervisor that
    # started this one is gone, or will never accept it).
    welcome_timeout: float | None = None
    # A program's main process (andon worker): SIGTERM/SIGINT drain the call, then exit.
    drain_on_term: bool = False
    # A pipe from the launcher (an ssh client's stdin, say): its end of file means the launcher
    # let go of this worker, or died. Then it is as if the supervisor were gone.
    lifeline_fd: int | None = None
    detach: bool = True  # leave the session and point fds 0/1/2 at the log (local workers)


def worker_main(options: WorkerOptions, worker_class: type[Worker] | None = None) -> str | None:
    """Entry point of a worker process (the target the pool starts). ``worker_class`` serves
    in place of :class:`Worker`: a test's worker that breaks the protocol on purpose, as a buggy
    or hostile one would (tools cannot: they run in call processes, away from the socket).

    Returns why the supervisor never took this worker (:attr:`Worker.refusal`), or None."""
    if options.supervisor_start is not None:
        # A local worker, the forkserver's child: until it watches the supervisor (its own
        # set-up takes seconds on a busy machine), it dies with the forkserver, which dies with
        # the supervisor (andon.fleet._spawner). Lifted once it watches: a forkserver
        # replaced later must not take running workers with it.
        set_parent_death_signal(_signal.SIGKILL)
    if options.forkserver_pid is not None and os.getppid() != options.forkserver_pid:
        # The forkserver died before the line above: its death signal will never come, and the
        # pool that wanted this worker is closed (it kills the forkserver last). Nobody waits.
        os._exit(0)
    if _supervisor_gone_already(options):
        # Killed while this worker was being forked: nothing was started, nothing to say.
        os._exit(0)
    if options.detach:
        _detach(options.log_path)
    mode = detect_mode(options.containment)
    if mode != "pgroup" and not set_child_subreaper():
        mode = "pgroup"
    worker = (worker_class or Worker)(options, mode)
    try:
        asyncio.run(worker.serve())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return worker.refusal


def _supervisor_gone_already(options: WorkerOptions) -> bool:
    """Whether the supervisor named by pid and start time is no longer running: checked first
    thing, before the worker's own set-up (which takes seconds on a busy machine)."""
    if options.supervisor_pid is None or options.supervisor_start is None:
        return False
    key = procs.ProcessKey(options.supervisor_pid, options.supervisor_start)
    handle = procs.Pidfd.open(key, zombie_ok=True)
    if handle is None:
        return True
    try:
        return handle.exited()
    finally:
        handle.close()


def leave_session_and_reset_signals() -> None:
    """Own session where possible, every signal at its default action and none blocked: tools
    inherit both, whatever andon itself was started with (a CI script may ignore SIGINT)."""
    with contextlib.suppress(PermissionError):
        os.setsid()
    for sig in _signal.valid_signals():
        if sig in (_signal.SIGKILL, _signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            _signal.signal(sig, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, set())


def _detach(log_path: str | None) -> None:
    # Own session: a terminal's Ctrl-C goes to the foreground group, which must reach only the
    # supervisor; it decides what to stop.
    leave_session_and_reset_signals()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    log_fd = devnull
    if log_path:
        # A log that cannot be opened (its folder deleted under the pool) costs the log, not
        # the worker: a worker that died of it would print a traceback on the supervisor's
        # stderr, and the pool would start another that dies alike.
        with contextlib.suppress(OSError):
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    if log_fd != devnull:
        os.close(log_fd)
    os.close(devnull)


_HEARTBEAT_MISSES = 3
"""The supervisor is lost after this many heartbeat intervals of silence (as the pool counts)."""

_ACTIVE: Worker | None = None
"""The worker of this process (one per process); tests reach its socket through it."""


class _Stop(Exception):
    """Ends the worker's task group."""


class Worker:
    """One worker process's service: says hello, runs one call at a time, answers the pool.

    A test subclasses it to break the protocol on purpose (:meth:`say_hello`, :meth:`send`) and
    runs it through ``worker_main(options, worker_class)``: the fault lives in the test, never in
    an option the worker reads."""

    def __init__(self, options: WorkerOptions, mode: Containment) -> None:
        self.options = options
        self.mode = mode
        self.reaper = Reaper()
        self.current: CallContext | None = None
        self.cgroups: CgroupTree | None = None
        self.worker_cgroup: Path | None = None
        self.heartbeat_interval: float | None = None
        self._welcomed = asyncio.Event()
        self._heard = time.monotonic()  # the supervisor's last frame (heartbeat deadline)
        self._draining = False
        self._stopping = asyncio.Event()  # set once a drain is over
        self._last_result: str | None = None  # the call id of the last result sent
        self._result_acked = asyncio.Event()  # the pool acknowledged it (program workers)
        self.refusal: str | None = None
        """Why the supervisor never took this worker, in one line: its handshake refused this
        worker's key, it answered ``refused`` (another protocol version, tools missing, an id
        it does not know), or no ``welcome`` came in time. ``andon worker`` prints it and exits
        non-zero (docs/scale-out.md, Refusals)."""
        self._sock: zmq.asyncio.Socket | None = None
        self._call_task: asyncio.Task[None] | None = None
        self._tasks: asyncio.TaskGroup | None = None  # serve()'s, once it runs
        # A call process forked ahead while idle, for the next Python call (docs/workers.md,
        # Spare call processes); None while a call has it, or when none is wanted.
        self._spare: Spare | None = None
        self._wants_spare = any(t.kind == "python" for t in options.registry)

    async def serve(self) -> None:
        global _ACTIVE
        _ACTIVE = self
        loop = asyncio.get_running_loop()
        self.reaper.install(loop)
        self._setup_cgroup()
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.options.worker_id.encode())
        sock.setsockopt(zmq.LINGER, self.options.linger_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, self.options.max_message_bytes * 2)
        handshake: zmq.asyncio.Socket | None = None
        if self.options.curve is not None and self.options.server_key is not None:
            curve_client(sock, self.options.curve, self.options.server_key)
            # Watched until the welcome: a key the supervisor refuses fails the handshake
            # (ZAP status 400), and zmq would otherwise retry it quietly for ever.
            handshake = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        sock.connect(self.options.endpoint)
        self._sock = sock
        watch_fd = self._watch_supervisor(loop)
        if self.options.supervisor_start is not None:
            set_parent_death_signal(0)  # watching now (worker_main)
        self._watch_lifeline(loop)
        if self.options.drain_on_term:
            for sig in (_signal.SIGTERM, _signal.SIGINT):
                loop.add_signal_handler(sig, self._on_stop_signal)
        try:
            await self.say_hello()
            try:
                async with asyncio.TaskGroup() as tg:
                    self._tasks = tg
                    tg.create_task(self._receive(tg))
                    tg.create_task(self._heartbeat())
                    if handshake is not None:
                        tg.create_task(self._watch_handshake(handshake))
                    tg.create_task(self._stop_when_drained())
                    if self._draining:
                        tg.create_task(self._drain())  # the signal came during the hello
            except* _Stop:
                pass
        finally:
            self._tasks = None  # a signal from here on finds nothing left to drain
            await self._let_go_of_spare()
            if watch_fd is not None:
                loop.remove_reader(watch_fd)
                os.close(watch_fd)
            if self.worker_cgroup is not None:
                CgroupTree.remove(self.worker_cgroup)
            if handshake is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.disable_monitor()
                handshake.close(linger=0)
            sock.close(linger=self.options.linger_ms)
            ctx.term()
            self.reaper.uninstall()

    def _setup_cgroup(self) -> None:
        if self.mode != "cgroup":
            return
        if self.options.cgroup_base is None or cgroup2_root() is None:
            self.mode = "subreaper"
            return
        self.cgroups = CgroupTree(Path(self.options.cgroup_base))
        try:
            self.cgroups.create_base()
            self.worker_cgroup = self.cgroups.leaf(f"worker-{self.options.worker_id}")
            CgroupTree.enter(self.worker_cgroup)
        except OSError:
            self.cgroups = None
            self.worker_cgroup = None
            self.mode = "subreaper"

    def _watch_lifeline(self, loop: asyncio.AbstractEventLoop) -> None:
        fd = self.options.lifeline_fd
        if fd is None:
            return

        def readable() -> None:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._supervisor_gone()

        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)

    def _watch_supervisor(self, loop: asyncio.AbstractEventLoop) -> int | None:
        pid = self.options.supervisor_pid
        if pid is None:
            return None
        start = self.options.supervisor_start
        if start is not None:
            # Its pid and start time: a reused pid is not our supervisor, who is then gone.
            handle = procs.Pidfd.open(procs.ProcessKey(pid, start), zombie_ok=True)
            if handle is None:
                self._supervisor_gone()
                return None
            fd = handle.fd
        else:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._supervisor_gone()
                return None
        loop.add_reader(fd, self._supervisor_gone)
        return fd

    def _supervisor_gone(self) -> None:
        # Synchronous on purpose: kill first, ask nothing, exit. The log has stopped; nothing
        # this worker started may keep writing.
        kill_everything(self.current, self.reaper, self.mode)
        os._exit(0)

    async def say_hello(self) -> None:
        """The first frame: who this worker is and which tools it offers."""
        await self.send(
            Hello(
                protocol=PROTOCOL_VERSION,
                worker_id=self.options.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                tools=self.options.registry.names,
            )
        )

    async def send(self, msg: Message) -> None:
        """Every frame this worker sends goes through here (a call's reports too)."""
        assert self._sock is not None
        await send_message(self._sock, msg)

    async def _watch_handshake(self, monitor: zmq.asyncio.Socket) -> None:
        """Until the welcome: a handshake the supervisor refused (ZAP status 400: this worker's
        key is not on its allow-list) ends the worker with that reason."""
        welcomed = asyncio.ensure_future(self._welcomed.wait())
        try:
            while True:
                frames = asyncio.ensure_future(monitor.recv_multipart())
                await asyncio.wait({welcomed, frames}, return_when=asyncio.FIRST_COMPLETED)
                if welcomed.done():
                    frames.cancel()
                    return
                event = parse_monitor_message(frames.result())
                if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    key = self.options.curve.public.decode() if self.options.curve else "?"
                    self.refusal = (
                        f"the supervisor at {self.options.endpoint} refused this worker's key "
                        f"{key} (status {event['value']}): add the public key to the keys it "
                        f"allows"
                    )
                    raise _Stop
        finally:
            welcomed.cancel()

    async def _heartbeat(self) -> None:
        try:
            await asyncio.wait_for(self._welcomed.wait(), self.options.welcome_timeout)
        except TimeoutError:
            # Nobody accepted this worker: nothing runs yet, so there is nothing to stop.
            self.refusal = (
                f"no welcome from the supervisor at {self.options.endpoint} within "
                f"{self.options.welcome_timeout:g}s (is it running and listening there, and is "
                f"this worker's id {self.options.worker_id!r} not taken?)"
            )
            raise _Stop from None
        interval = self.heartbeat_interval
        if interval is None:
            return  # local: liveness through pidfds, both ways
        deadline = interval * _HEARTBEAT_MISSES
        while True:
            await asyncio.sleep(interval)  # sleep-ok: the heartbeat's own period
            if time.monotonic() - self._heard > deadline:
                self._supervisor_gone()  # the supervisor, or the way to it, is gone
            await self.send(Heartbeat(time=time.time()))

    def _on_stop_signal(self) -> None:
        if self._draining:
            return
        self._draining = True
        # In serve()'s task group, like every task of the worker: nothing outlives serve(), and
        # a drain that fails fails the worker instead of vanishing with an unread exception.
        if self._tasks is not None:
            self._tasks.create_task(self._drain())

    async def _drain(self) -> None:
        """SIGTERM as a program: stop the call on its own grace ladder (interrupt, then TERM and
        KILL after the call's ``term_after`` and ``kill_after``), send its result, exit.

        The same :class:`GraceLadder` as the executor's, walked on this worker's clock: no
        supervisor is stopping the call, so nobody gives up on this worker (no
        ``kill_ack_timeout``); it waits for its call whatever happens."""
        call, task = self.current, self._call_task
        if call is not None and task is not None and not task.done():
            ladder = GraceLadder(call.run.grace, python=call.python)
            timeline: Timeline = Running(began=time.monotonic(), timeout=None)
            event: LadderEvent = BeginStop("abort", None)
            while not task.done():
                timeline, actions = ladder.step(timeline, event, time.monotonic())
                wake: float | None = None
                for action in actions:
                    match action:
                        case SendStage() if not task.done():  # a call over needs no more
                            call.cancel(
                                Cancel(
                                    call_id=call.run.call_id,
                                    stage=action.stage,
                                    cause=action.cause.to_dict() if action.cause else None,
                                    kill_in=action.kill_in,
                                )
                            )
                            await call.flush_reports()
                        case ArmTimer(at=at):
                            wake = at
                        case _:
                            pass  # this ladder never gives up on its own worker
                if task.done():
                    break
                timeout = None if wake is None else max(0.0, wake - time.monotonic())
                await asyncio.wait({task}, timeout=timeout)
                event = Tick()
            await asyncio.wait({task})  # the result goes out in _run
            # Exit only once the supervisor has the result: a worker whose exit is seen before
            # its last frame is read would have its call written off as lost. (Bounded: a
            # supervisor that does not answer has lost this worker anyway.)
            interval = self.heartbeat_interval or 1.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._result_acked.wait(), interval * _HEARTBEAT_MISSES)
        self._stopping.set()

    async def _receive(self, tg: asyncio.TaskGroup) -> None:
        assert self._sock is not None
        while True:
            try:
                msg = await recv_message(self._sock, self.options.max_message_bytes)
            except ProtocolError as e:
                # A malformed frame sent *to* a worker gets an error reply; it never crashes it.
                self._heard = time.monotonic()  # a bad frame still shows the supervisor is there
                await self.send(ErrorReply(reason=str(e), call_id=e.call_id))
                continue
            self._heard = time.monotonic()
            match msg:
                case Welcome():
                    self.heartbeat_interval = msg.heartbeat_interval or None
                    self._welcomed.set()
                    self._refill()
                case Refused():
                    if not self._welcomed.is_set():
                        self.refusal = f"refused by the supervisor: {msg.reason}"
                    await self._shutdown()
                    raise _Stop
                case Shutdown():
                    await self._shutdown()
                    raise _Stop
                case Run():
                    if self._draining:
                        await self.send(
                            ErrorReply(reason="stopping: takes no new call", call_id=msg.call_id)
                        )
                        continue
                    if self.current is not None:
                        await self.send(
                            ErrorReply(reason="busy: one call at a time", call_id=msg.call_id)
                        )
                        continue
                    self.current = CallContext(
                        msg,
                        registry=self.options.registry,
                        reaper=self.reaper,
                        mode=self.mode,
                        cgroups=self.cgroups,
                        worker_cgroup=self.worker_cgroup,
                        send=self.send,
                        spare=self._spare,
                    )
                    self._spare = None  # the call's now: used by a Python call, else given back
                    self._call_task = tg.create_task(self._run(self.current))
                case Cancel():
                    call = self.current
                    if call is not None and call.run.call_id == msg.call_id:
                        call.cancel(msg)
                        await call.flush_reports()
                    # A cancel for a call that already finished is ignored: it is idempotent.
                case Ack():
                    call = self.current
                    if call is not None and call.run.call_id == msg.call_id:
                        call.ack(msg.offset)
                    elif msg.call_id == self._last_result:
                        self._result_acked.set()  # the supervisor has the call's result
                case Heartbeat():
                    pass
                case _:
                    await self.send(
                        ErrorReply(reason=f"unexpected message {msg.type!r} sent to a worker")
                    )

    async def _stop_when_drained(self) -> None:
        await self._stopping.wait()
        raise _Stop

    async def _run(self, call: CallContext) -> None:
        try:
            result = await run_call(call)
        except Exception as e:  # an andon bug: answer the call rather than vanish
            result = internal_error_result(call, e)
        finally:
            self.current = None
            self._spare, call.spare = call.spare, None  # not a Python call: still unused
        self._last_result = call.run.call_id
        self._result_acked.clear()
        await self.send(result)
        self._refill()

    def _refill(self) -> None:
        """Fork the next call's process ahead, now that the worker is idle: after the welcome,
        and after each result has gone out (so the fork never delays a result, and never runs
        beside a call, whose own pages it would make the worker copy). Not when draining or
        stopping, and not when no Python tool is registered. A fork that fails costs nothing
        but the head start: the next call forks its own."""
        if (
            self._spare is not None
            or self.current is not None
            or not self._wants_spare
            or self._draining
            or self._tasks is None
        ):
            return
        try:
            spare = Spare.fork(self.options.registry)
        except OSError:
            return
        self.reaper.watch(spare.pid)  # pinned from here on: its pid and group stay its own
        self._spare = spare

    async def _let_go_of_spare(self) -> None:
        """End the unused spare before the worker goes (nothing of it may outlive the worker;
        the worker's cgroup can be removed only once it has left)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return
        if not self.reaper.holds(spare.pid):
            retire_spare(spare, self.reaper)  # it has exited already, and been reaped
            return
        spare.close()
        procs.killpg_pinned(spare.pid, _signal.SIGKILL)
        # Bounded: after SIGKILL only an uninterruptible sleep can delay the exit.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.reaper.wait(spare.pid), 5.0)
        self.reaper.forget(spare.pid)

    async def _shutdown(self) -> None:
        call, task = self.current, self._call_task
        if call is not None:
            call.cancel("kill")
            await call.flush_reports()
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=10.0)  # the call's result goes out first
