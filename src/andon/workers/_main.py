"""The worker process: one tool call at a time, reached over a ZeroMQ DEALER socket.

Start-up (workers.md, Worker lifecycle): become a child subreaper, leave the terminal's session,
reset every signal disposition (a CI script may have started andon with SIGINT ignored), point fds
0/1/2 at /dev/null and a worker log (a Python tool's ``print`` must never reach the supervisor's
stdout), then say ``hello``. If the supervisor disappears (a pidfd on it becomes readable), the
worker SIGKILLs its call's processes at once and exits: no tool keeps writing after its log stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import zmq
import zmq.asyncio

from andon.base import ProtocolError
from andon.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Cancel,
    ErrorReply,
    Heartbeat,
    Hello,
    Message,
    Reject,
    Run,
    Shutdown,
    Started,
    Welcome,
    decode,
    encode,
)
from andon.workers._calls import CallContext, internal_error_result, kill_everything, run_call
from andon.workers._containment import (
    CgroupTree,
    ContainmentMode,
    ContainmentSetting,
    cgroup2_root,
    detect_mode,
    set_child_subreaper,
)
from andon.workers._reaper import Reaper
from andon.workers._registry import ToolRegistry

__all__ = ["WorkerOptions", "worker_main"]


@dataclass(frozen=True)
class WorkerOptions:
    endpoint: str
    worker_id: str
    registry: ToolRegistry
    supervisor_pid: int | None = None  # local workers watch it with a pidfd
    containment: ContainmentSetting = "auto"
    log_path: str | None = None
    cgroup_base: str | None = None  # the pool's own cgroup tree (cgroup mode)
    max_message_bytes: int = 16 * 1024 * 1024
    linger_ms: int = 500
    # Tests only: break the protocol on purpose, as a buggy or hostile worker would. Tools cannot
    # do it themselves: they run in call processes, away from the worker's socket.
    fault: Literal["garbage-after-started"] | None = None


def worker_main(options: WorkerOptions) -> None:
    """Entry point of a worker process (the target the pool starts)."""
    _detach(options.log_path)
    mode = detect_mode(options.containment)
    if mode != "pgroup" and not set_child_subreaper():
        mode = "pgroup"
    try:
        asyncio.run(Worker(options, mode).serve())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _detach(log_path: str | None) -> None:
    # Own session: a terminal's Ctrl-C goes to the foreground group, which must reach only the
    # supervisor; it decides what to stop.
    with contextlib.suppress(PermissionError):
        os.setsid()
    for sig in _signal.valid_signals():
        if sig in (_signal.SIGKILL, _signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            _signal.signal(sig, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, set())
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    log_fd = (
        os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if log_path else devnull
    )
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    if log_fd != devnull:
        os.close(log_fd)
    os.close(devnull)


_ACTIVE: Worker | None = None
"""The worker of this process (one per process); tests reach its socket through it."""


class _Stop(Exception):
    """Ends the worker's task group."""


class Worker:
    def __init__(self, options: WorkerOptions, mode: ContainmentMode) -> None:
        self.options = options
        self.mode = mode
        self.reaper = Reaper()
        self.current: CallContext | None = None
        self.cgroups: CgroupTree | None = None
        self.worker_cgroup: Path | None = None
        self.heartbeat_interval: float | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._call_task: asyncio.Task[None] | None = None

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
        sock.connect(self.options.endpoint)
        self._sock = sock
        watch_fd = self._watch_supervisor(loop)
        try:
            await self.send(
                Hello(
                    protocol=PROTOCOL_VERSION,
                    worker_id=self.options.worker_id,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    tools=self.options.registry.names,
                )
            )
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._receive(tg))
                    tg.create_task(self._heartbeat())
            except* _Stop:
                pass
        finally:
            if watch_fd is not None:
                loop.remove_reader(watch_fd)
                os.close(watch_fd)
            if self.worker_cgroup is not None:
                CgroupTree.remove(self.worker_cgroup)
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

    def _watch_supervisor(self, loop: asyncio.AbstractEventLoop) -> int | None:
        pid = self.options.supervisor_pid
        if pid is None:
            return None
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

    async def send(self, msg: Message) -> None:
        assert self._sock is not None
        await self._sock.send_multipart(encode(msg))
        if self.options.fault == "garbage-after-started" and isinstance(msg, Started):
            await self._sock.send_multipart([b"\xc1 not msgpack", b"\x00"])

    async def _heartbeat(self) -> None:
        while True:
            if self.heartbeat_interval is None:
                await asyncio.sleep(3600)  # sleep-ok: no heartbeats until a welcome sets them
                continue
            await asyncio.sleep(self.heartbeat_interval)
            await self.send(Heartbeat(time=time.time()))

    async def _receive(self, tg: asyncio.TaskGroup) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart(copy=True)
            try:
                msg = decode(frames, self.options.max_message_bytes)
            except ProtocolError as e:
                # A malformed frame sent *to* a worker gets an error reply; it never crashes it.
                await self.send(ErrorReply(reason=str(e), call_id=e.call_id))
                continue
            match msg:
                case Welcome():
                    self.heartbeat_interval = msg.heartbeat_interval or None
                case Reject() | Shutdown():
                    await self._shutdown()
                    raise _Stop
                case Run():
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
                    )
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
                case Heartbeat():
                    pass
                case _:
                    await self.send(
                        ErrorReply(reason=f"unexpected message {msg.type!r} sent to a worker")
                    )

    async def _run(self, call: CallContext) -> None:
        try:
            result = await run_call(call)
        except Exception as e:  # an andon bug: answer the call rather than vanish
            result = internal_error_result(call, e)
        finally:
            self.current = None
        await self.send(result)

    async def _shutdown(self) -> None:
        call, task = self.current, self._call_task
        if call is not None:
            call.cancel("kill")
            await call.flush_reports()
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=10.0)  # the call's result goes out first
