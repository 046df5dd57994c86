"""Running one tool call inside a worker, and stopping it.

A shell call runs ``bash -c`` in a new session (its own process group); a Python call runs in a
call process forked from the worker, in its own process group (``_pycall``). Either is inside the
call's cgroup where there is one. Whoever walks the grace ladder (the supervisor's executor, or
``andon worker``'s own SIGTERM drain) sends the stages; this module applies them. Every signal
goes through :meth:`CallProcesses.stop` (its :meth:`~CallProcesses.signal` is the same for every
member, strays included), which reaches processes only through :mod:`andon.procs`; a Python
tool's interrupt is no signal at all but a cooperative cancel written to its call process's pipe
(:meth:`CallProcess.cancel`).

**A cancel is never lost.** One that arrives before the call's process exists (the call is still
being validated, or is about to spawn) is kept, and the spawn does not happen: the result says the
call never started. From the spawn on, every stage reaches the process group at once.

**When the group leader exits, the call is over.** Whatever remains is swept at once: SIGTERM,
then SIGKILL after ``min(kill_after, time left to the timeline's KILL stage)``, ending the moment
nothing remains. The sweep runs after every call, normal or not, so nothing outlives its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import math
import os
import signal as _signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from andon import procs as _procs
from andon.base import (
    CANCEL_STAGES,
    CancelStage,
    Cause,
    Containment,
    EndedBy,
    ErrorCode,
    SignalStage,
    User,
    cause_from_dict,
    name_path,
    show_name,
)
from andon.protocol import (
    OUTPUT_WINDOW,
    Cancel,
    ErrorInfo,
    Message,
    Output,
    Result,
    Run,
    Signalled,
    Started,
)
from andon.workers._containment import CgroupTree
from andon.workers._group import CallProcesses
from andon.workers._output import HeadTail
from andon.workers._pycall import CallProcess, Outcome, Spare
from andon.workers._pycall import spawn as spawn_call_process
from andon.workers._reaper import Reaper, WaitStatus
from andon.workers._registry import ArgumentError, Tool, ToolRegistry, validate_arguments

__all__ = [
    "CallContext",
    "CallStop",
    "internal_error_result",
    "kill_everything",
    "retire_spare",
    "run_call",
]

_READ_CHUNK = 1024 * 1024
_PIPE_SIZE = 1024 * 1024
TAG_VAR = _procs.TAG_VAR

Send = Callable[[Message], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class CallStop:
    """What the worker knows of its call's stop: one value, replaced on each cancel. (The ladder
    itself is walked by whoever sends the cancels: the executor, or this worker's own SIGTERM
    drain; this is the receiving end.)"""

    last_stage: CancelStage | None = None
    """The strongest stage applied to the running call; only grows. How the call ended
    (``ended_by``) is the last stage that reached it before its leader exited."""
    requested: CancelStage | None = None
    """A stage that arrived before the call's process existed; only grows. The spawn checks it
    with no await in between and does not happen: a cancel is never lost."""
    cause: Cause | None = None
    """The first cause a cancel carried (never replaced): what a Python tool's signal aborts
    with, however many stages follow."""
    kill_deadline: float | None = None
    """When the ladder sends KILL (each cancel says how far off it is), on the worker's monotonic
    clock; only moves earlier. The sweep never waits past it. ``None``: no stop under way, and
    the sweep waits ``kill_after``."""

    def with_cancel(self, msg: Cancel, now: float) -> CallStop:
        """The value once ``msg`` arrived at ``now``: its KILL deadline and its cause, if first."""
        kill_deadline = self.kill_deadline
        if math.isfinite(msg.kill_in):
            deadline = now + max(0.0, msg.kill_in)
            kill_deadline = min(kill_deadline or deadline, deadline)
        cause = self.cause if self.cause is not None else _cause_of(msg)
        return replace(self, kill_deadline=kill_deadline, cause=cause)

    def with_requested(self, stage: CancelStage) -> CallStop:
        """The value once ``stage`` arrived before the spawn: kept, the strongest one."""
        return replace(self, requested=_later(self.requested, stage))

    def with_applied(self, stage: CancelStage) -> CallStop:
        """The value once ``stage`` reached the running call."""
        return replace(self, last_stage=_later(self.last_stage, stage))


class CallContext:
    """What a running call needs from its worker, and the cancel entry point."""

    def __init__(
        self,
        run: Run,
        *,
        registry: ToolRegistry,
        reaper: Reaper,
        mode: Containment,
        cgroups: CgroupTree | None,
        worker_cgroup: Path | None,
        send: Send,
        spare: Spare | None = None,
    ) -> None:
        self.run = run
        self.registry = registry
        self.reaper = reaper
        self.mode = mode
        self.cgroups = cgroups
        self.worker_cgroup = worker_cgroup
        self.send = send
        self.started_at = time.monotonic()
        """When the worker took the call (real time: the worker has no clock to share); the
        ``at`` of every ``signalled`` report counts from here."""
        self.stop = CallStop()
        """The call's stop as the cancels so far made it; replaced whole by :meth:`cancel`."""
        self.procs: CallProcesses | None = None
        self.call_process: CallProcess | None = None
        self.spare = spare
        """The worker's spare call process: a Python call takes it (and lets go of it if the
        handover fails); any other call, or one that never starts, leaves it to the worker."""
        self._pending: list[Signalled] = []
        # Output flow control: bytes the supervisor has consumed, and how to resume reading.
        self.acked = 0
        self.on_ack: Callable[[], None] | None = None

    @property
    def python(self) -> bool:
        """A Python tool (its interrupt is its cooperative signal, not SIGINT)."""
        tool = self.registry.get(self.run.tool)
        return tool is not None and tool.kind == "python"

    def ack(self, offset: int) -> None:
        """The supervisor consumed the output up to ``offset``: the window moves on."""
        if offset > self.acked:
            self.acked = offset
            if self.on_ack is not None:
                self.on_ack()

    # -- cancel ------------------------------------------------------------------------------

    def cancel(self, msg: Cancel | CancelStage) -> None:
        """Apply one stage of the grace timeline (synchronously; reports are sent after)."""
        if isinstance(msg, str):
            msg = Cancel(
                call_id=self.run.call_id, stage=msg, kill_in=0.0 if msg == "kill" else math.inf
            )
        stage = msg.stage
        self.stop = self.stop.with_cancel(msg, time.monotonic())
        if self.procs is None:
            # Not spawned yet (being validated, or waiting for its task to run): remember the
            # strongest stage; the spawn checks it and does not start the tool.
            self.stop = self.stop.with_requested(stage)
            return
        if self.call_process is not None and stage == "interrupt":
            # A Python tool's cooperative stop: its signal aborts, with the real cause.
            delivered = self.call_process.cancel(self.stop.cause or User())
            self._report(stage, 1 if delivered else 0)
            self.stop = self.stop.with_applied(stage)
            return
        # Once the leader is reaped the call is over and its sweep stops what is left; only a
        # KILL (force) still acts at once. ``pinned`` (not "the wait has returned") is the test:
        # the reaper may have reaped the leader a moment before this cancel arrived.
        if not self.procs.pinned:
            if stage == "kill":
                self._signal("kill", _signal.SIGKILL, group_only=False)
            return
        # Whether a shell call gets the interrupt at all is the ladder's rule (GraceLadder.step),
        # applied by whoever walks it: an interrupt that comes is sent.
        if stage == "interrupt":
            self._signal(stage, _signal.SIGINT, group_only=True)
        elif stage == "term":
            self._signal(stage, _signal.SIGTERM, group_only=True)
        else:
            self._signal(stage, _signal.SIGKILL, group_only=False)
        self.stop = self.stop.with_applied(stage)

    def _signal(self, stage: SignalStage, sig: int, *, group_only: bool) -> int:
        assert self.procs is not None
        targets = len(self.procs.stop(sig, group_only=group_only))
        self._report(stage, targets)
        return targets

    def _report(self, stage: SignalStage, targets: int) -> None:
        self._pending.append(
            Signalled(call_id=self.run.call_id, stage=stage, at=self.elapsed(), targets=targets)
        )

    async def flush_reports(self) -> None:
        pending, self._pending = self._pending, []
        for report in pending:
            await self.send(report)

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def sweep_delay(self) -> float:
        """How long the sweep waits between SIGTERM and SIGKILL."""
        kill_after = self.run.grace.kill_after
        kill_deadline = self.stop.kill_deadline
        if kill_deadline is None:
            return kill_after
        return max(0.0, min(kill_after, kill_deadline - time.monotonic()))

    def call_cgroup(self) -> Path | None:
        """Create the call's cgroup leaf (cgroup mode), named after its unique tag."""
        if self.mode == "cgroup" and self.cgroups is not None:
            return self.cgroups.leaf(f"call-{self.run.tag}")
        return None


def _later(current: CancelStage | None, stage: CancelStage) -> CancelStage:
    """The later of two stages (stages never go back)."""
    if current is None or CANCEL_STAGES.index(stage) > CANCEL_STAGES.index(current):
        return stage
    return current


def _cause_of(msg: Cancel) -> Cause | None:
    if msg.cause is None:
        return None
    try:
        return cause_from_dict(msg.cause)
    except ValueError:
        return None  # the supervisor wrote it; an unknown cause still stops the call


async def run_call(ctx: CallContext) -> Result:
    """Run the call to the end (normal or stopped) and return its result."""
    tool = ctx.registry.get(ctx.run.tool)
    if tool is None:
        return _not_run(ctx, ErrorCode.UNKNOWN_TOOL, f"unknown tool {ctx.run.tool!r}")
    try:
        arguments = validate_arguments(tool.parameters, ctx.run.arguments)
    except ArgumentError as e:
        return _not_run(ctx, ErrorCode.INVALID_ARGUMENTS, f"invalid arguments: {e}")
    if ctx.stop.requested is not None:
        # Checked right before the spawn, with no await in between: a cancel that arrived
        # before this line stops the call here; one after it finds the process group.
        return _not_run(
            ctx, ErrorCode.ABORTED_BEFORE_DISPATCH, "tool call aborted before it started"
        )
    if tool.kind == "shell":
        return await _run_shell(ctx, arguments)
    return await _run_python(ctx, tool, arguments)


_NOT_RUN_NAMES = {
    ErrorCode.UNKNOWN_TOOL: "UnknownTool",
    ErrorCode.INVALID_ARGUMENTS: "InvalidArguments",
    ErrorCode.ABORTED_BEFORE_DISPATCH: "Aborted",
    ErrorCode.TOOL_ERROR: "ToolError",
}


def _not_run(ctx: CallContext, code: ErrorCode, message: str) -> Result:
    return Result(
        call_id=ctx.run.call_id,
        exit_code=None,
        exit_signal=None,
        ended_by="not-run",
        content=f"Error: {message}",
        output_head=b"",
        output_tail=b"",
        output_bytes=0,
        duration=ctx.elapsed(),
        error=ErrorInfo(name=_NOT_RUN_NAMES.get(code, "ToolError"), code=code, message=message),
    )


def internal_error_result(ctx: CallContext, error: Exception) -> Result:
    message = f"internal error in the worker: {type(error).__name__}: {error}"
    return Result(
        call_id=ctx.run.call_id,
        exit_code=None,
        exit_signal=None,
        ended_by=ctx.stop.last_stage or "exit",
        content=f"Error: {message}",
        output_head=b"",
        output_tail=b"",
        output_bytes=0,
        duration=ctx.elapsed(),
        error=ErrorInfo(name="InternalError", code=ErrorCode.INTERNAL, message=message),
    )


def tool_environment(run: Run) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in run.env_remove}
    env.update((name_path(k), name_path(v)) for k, v in run.env_add.items())
    env["ANDON_CALL_ID"] = run.call_id
    env[TAG_VAR] = run.tag
    return env


@contextlib.contextmanager
def _inside(ctx: CallContext, call_cgroup: Path | None) -> Iterator[None]:
    """Keep the worker in the call's cgroup for the spawn, then step back to its own leaf, so
    the tool is inside from its first instruction (no preexec_fn, no race with its first forks)."""
    if call_cgroup is None:
        yield
        return
    CgroupTree.enter(call_cgroup)
    try:
        yield
    finally:
        if ctx.worker_cgroup is not None:
            CgroupTree.enter(ctx.worker_cgroup)


async def _announce(
    ctx: CallContext, pid: int, call_cgroup: Path | None, create_time: float | None = None
) -> None:
    """The call's process exists: hold it, and tell the supervisor what to stop if we vanish.
    (``create_time``: the leader's, if already known.)"""
    run = ctx.run
    ctx.reaper.watch(pid)
    ctx.procs = CallProcesses(
        mode=ctx.mode,
        worker_pid=os.getpid(),
        reaper=ctx.reaper,
        pgid=pid,
        cgroup=call_cgroup,
        tag=_procs.tag_entry(run.tag),
        spare=ctx.spare.pid if ctx.spare is not None else None,
    )
    if create_time is None:
        # The leader is our unreaped child: its stat line is there even if it has exited.
        leader = _procs.stat(pid)
        create_time = leader.key.create_time if leader is not None else 0.0
    await ctx.send(
        Started(
            call_id=run.call_id,
            pid=pid,
            pgid=pid,
            create_time=create_time,
            containment=ctx.mode,
            cgroup=str(call_cgroup) if call_cgroup is not None else None,
        )
    )


async def _run_shell(ctx: CallContext, arguments: dict[str, Any]) -> Result:
    run = ctx.run
    command = str(arguments["command"])
    cwd = os.path.join(name_path(run.cwd), name_path(str(arguments.get("cwd") or ".")))
    env = tool_environment(run)
    output = HeadTail(run.output_head_bytes, run.output_tail_bytes)
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    call_cgroup: Path | None = None
    try:
        call_cgroup = ctx.call_cgroup()
        with _inside(ctx, call_cgroup):
            popen = subprocess.Popen(
                ["bash", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as e:
        os.close(read_fd)
        os.close(write_fd)
        if call_cgroup is not None:
            CgroupTree.remove(call_cgroup)
        message = f"could not start bash: {e.strerror or e}"
        if e.errno == errno.ENOENT and not os.path.isdir(cwd):
            message = f"working directory {show_name(cwd)} does not exist"
        return _not_run(ctx, ErrorCode.TOOL_ERROR, message)
    os.close(write_fd)
    # A bigger pipe means fewer, larger output messages (each costs a trip through both event
    # loops): 64 KiB pipes capped a flood at ~110 MB/s. Best effort: the limit is the system's.
    with contextlib.suppress(OSError):
        fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    pid = popen.pid
    await _announce(ctx, pid, call_cgroup)
    loop = asyncio.get_running_loop()
    os.set_blocking(read_fd, False)
    pending_sends: list[asyncio.Task[None]] = []
    eof = False
    paused = False

    def pump(*, drain: bool = False) -> bool:
        """Read what is there, up to the window the supervisor allows (all of it once the
        writers are gone: the pipe holds at most its own size); return False at EOF."""
        nonlocal eof, paused
        while True:
            if not drain and output.total - ctx.acked >= OUTPUT_WINDOW:
                # Back-pressure: stop reading until the supervisor catches up; the tool blocks
                # on its full pipe meanwhile.
                if not paused:
                    loop.remove_reader(read_fd)
                    paused = True
                return True
            try:
                data = os.read(read_fd, _READ_CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                eof = True
                loop.remove_reader(read_fd)
                return False
            offset = output.total
            output.add(data)
            msg = Output(call_id=run.call_id, stream="stdout", data=data, offset=offset)
            pending_sends.append(loop.create_task(ctx.send(msg)))

    def resume() -> None:
        nonlocal paused
        if paused and not eof and output.total - ctx.acked < OUTPUT_WINDOW:
            paused = False
            loop.add_reader(read_fd, pump)

    ctx.on_ack = resume
    loop.add_reader(read_fd, pump)
    try:
        status, ended_by, strays = await _wait_and_sweep(ctx, pid)
        popen.returncode = status.code if status.code is not None else -(status.signal or 0)
        if not eof:
            pump(drain=True)  # the writers are gone: take what is left, without waiting
    finally:
        ctx.on_ack = None
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(read_fd)
        os.close(read_fd)
        if call_cgroup is not None:
            CgroupTree.remove(call_cgroup)
    if pending_sends:
        await asyncio.gather(*pending_sends)
    await ctx.flush_reports()
    return Result(
        call_id=run.call_id,
        exit_code=status.code,
        exit_signal=status.signal,
        ended_by=ended_by,
        content="",
        output_head=bytes(output.head),
        output_tail=output.tail,
        output_bytes=output.total,
        duration=ctx.elapsed(),
        strays_killed=strays,
    )


async def _wait_and_sweep(ctx: CallContext, pid: int) -> tuple[WaitStatus, EndedBy, int]:
    """Wait for the leader's exit, then sweep what the call left: (status, ended_by, strays).
    Every mode reaches what it counts as a member (pgroup mode by the tag), so nothing is left
    to report as unreachable."""
    status = await ctx.reaper.wait(pid)
    ended_by: EndedBy = ctx.stop.last_stage or "exit"
    strays = await _sweep(ctx)
    return status, ended_by, strays


async def _sweep(ctx: CallContext) -> int:
    """Stop whatever the call left behind; return how many distinct processes were signalled."""
    procs = ctx.procs
    assert procs is not None
    procs.reaper.reap()
    if not procs.maybe_any():  # the common case: nothing left, and no /proc scan to know it
        return 0
    reached = procs.stop(_signal.SIGTERM, group_only=False)
    # Zombies in ``reached`` were alive when the signal went out (ours were reaped just before).
    seen = {(m.pid, m.start) for m in reached}
    if not seen:
        # The scan behind that stop may have raced a fork-and-exit and missed the new child
        # (CallProcesses._raced): only a conclusive scan, after reaping, says nothing is left.
        if await procs.wait_gone(0.0):
            return 0
        seen = {(m.pid, m.start) for m in procs.stop(_signal.SIGTERM, group_only=False)}
    await ctx.send(
        Signalled(call_id=ctx.run.call_id, stage="sweep-term", at=ctx.elapsed(), targets=len(seen))
    )
    if await procs.wait_gone(ctx.sweep_delay()):
        return len(seen)
    reached = procs.stop(_signal.SIGKILL, group_only=False)
    seen |= {(m.pid, m.start) for m in reached}
    await ctx.send(
        Signalled(
            call_id=ctx.run.call_id, stage="sweep-kill", at=ctx.elapsed(), targets=len(reached)
        )
    )
    # After SIGKILL only an uninterruptible sleep can delay the exit; keep killing what appears
    # (a fork that raced the kill) until nothing is left.
    while not await procs.wait_gone(1.0):
        seen |= {(m.pid, m.start) for m in procs.stop(_signal.SIGKILL, group_only=False)}
    return len(seen)


async def _run_python(ctx: CallContext, tool: Tool, arguments: dict[str, Any]) -> Result:
    run = ctx.run
    call_cgroup: Path | None = None
    child: CallProcess | None = None
    create_time: float | None = None
    try:
        call_cgroup = ctx.call_cgroup()
        spare, ctx.spare = ctx.spare, None
        if spare is not None:
            child = _hand_over(ctx, spare, arguments, call_cgroup)
            create_time = spare.create_time if child is not None else None
        if child is None:
            with _inside(ctx, call_cgroup):
                child = spawn_call_process(run, tool, arguments)
    except OSError as e:
        if call_cgroup is not None:
            CgroupTree.remove(call_cgroup)
        message = f"could not start the call process: {e.strerror or e}"
        return _not_run(ctx, ErrorCode.TOOL_ERROR, message)
    ctx.call_process = child
    child.start_reading(asyncio.get_running_loop())
    try:
        await _announce(ctx, child.pid, call_cgroup, create_time)
        status, ended_by, strays = await _wait_and_sweep(ctx, child.pid)
        outcome = child.take_outcome()
    finally:
        child.close()
        if call_cgroup is not None:
            CgroupTree.remove(call_cgroup)
    await ctx.flush_reports()
    if outcome is None:
        outcome = _no_outcome(status, stopped=ended_by != "exit")
    data = outcome.content.encode("utf-8")  # valid: the call process made it so
    return Result(
        call_id=run.call_id,
        exit_code=None,
        exit_signal=status.signal,
        ended_by=ended_by,
        content=outcome.content,
        output_head=b"",
        output_tail=b"",
        output_bytes=len(data),
        duration=ctx.elapsed(),
        error=outcome.error,
        strays_killed=strays,
    )


def _hand_over(
    ctx: CallContext, spare: Spare, arguments: dict[str, Any], call_cgroup: Path | None
) -> CallProcess | None:
    """Make the spare this call's process, or let go of it and return None (the caller forks
    one for the call). Synchronous, like the fork it replaces: no cancel is handled in between.

    The spare is the worker's unreaped child (the reaper holds it), so its pid, and the group it
    leads, are still its own: moving it into the call's cgroup cannot move a stranger. It is
    moved before it reads its call, so the tool, and everything it starts, is inside from its
    first line; it has no child of its own to leave behind."""
    frame = spare.handover(ctx.run, arguments)
    if frame is not None and ctx.reaper.holds(spare.pid):
        try:
            if call_cgroup is not None:
                CgroupTree.enter(call_cgroup, spare.pid)
        except OSError:
            pass  # it has exited (a zombie cannot be moved): let go of it below
        else:
            child = spare.hand_over(frame)
            if child is not None:
                return child
    retire_spare(spare, ctx.reaper)
    return None


def retire_spare(spare: Spare, reaper: Reaper) -> None:
    """Let go of a spare nobody will use: close its pipe (it exits on its own when it reads the
    end) and, while its group is still pinned, SIGKILL that group. Its exit is reaped like a
    stray's."""
    spare.close()
    if reaper.holds(spare.pid):
        _procs.killpg_pinned(spare.pid, _signal.SIGKILL)
    reaper.forget(spare.pid)


def _no_outcome(status: WaitStatus, *, stopped: bool) -> Outcome:
    """The call process ended without a result: stopped by a stage, or it died on its own."""
    if stopped:
        return Outcome("", None)  # the supervisor says how it was stopped
    how = (
        f"was killed by signal {status.signal}"
        if status.signal is not None
        else f"exited with code {status.code}"
    )
    message = f"the tool's process {how} before returning a result"
    return Outcome(
        f"Error: {message}", ErrorInfo(name="ToolError", code=ErrorCode.TOOL_ERROR, message=message)
    )


def kill_everything(ctx: CallContext | None, reaper: Reaper, mode: Containment) -> None:
    """Emergency stop (the supervisor vanished): SIGKILL the call's group, strays and cgroup."""
    if ctx is not None and ctx.procs is not None:
        ctx.procs.signal(_signal.SIGKILL)
    everything = CallProcesses(mode="subreaper", worker_pid=os.getpid(), reaper=reaper)
    everything.signal(_signal.SIGKILL)
