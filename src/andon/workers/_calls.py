"""Running one tool call inside a worker, and stopping it.

A shell call runs ``bash -c`` in a new session (its own process group), optionally inside a
per-call cgroup. The supervisor's executor owns the grace timeline and sends the stages; this
module applies them with :class:`CallProcesses`, the one signalling function.

**When the group leader exits, the call is over.** Whatever remains is swept at once: SIGTERM,
then SIGKILL after ``min(kill_after, time left to the timeline's KILL stage)``, ending the moment
nothing remains. The sweep runs after every call, normal or not, so nothing outlives its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import signal as _signal
import subprocess
import time
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from andon.base import AbortController, Aborted, ErrorCode, User
from andon.base import procs as _procs
from andon.protocol import (
    CancelStage,
    EndedBy,
    ErrorInfo,
    Message,
    Output,
    Result,
    Run,
    Signalled,
    SignalStage,
    Started,
)
from andon.workers._containment import CgroupTree, ContainmentMode
from andon.workers._group import CallProcesses
from andon.workers._output import HeadTail
from andon.workers._reaper import Reaper
from andon.workers._registry import ArgumentError, Tool, ToolRegistry, validate_arguments

__all__ = ["CallContext", "internal_error_result", "kill_everything", "run_call"]

_READ_CHUNK = 64 * 1024
TAG_VAR = _procs.TAG_VAR

Send = Callable[[Message], Coroutine[Any, Any, None]]


class CallContext:
    """What a running call needs from its worker, and the cancel entry point."""

    def __init__(
        self,
        run: Run,
        *,
        registry: ToolRegistry,
        reaper: Reaper,
        mode: ContainmentMode,
        cgroups: CgroupTree | None,
        worker_cgroup: Path | None,
        send: Send,
    ) -> None:
        self.run = run
        self.registry = registry
        self.reaper = reaper
        self.mode = mode
        self.cgroups = cgroups
        self.worker_cgroup = worker_cgroup
        self.send = send
        self.started_at = time.monotonic()
        self.stop_started_at: float | None = None
        self.last_stage: CancelStage | None = None
        self.procs: CallProcesses | None = None
        self.controller = AbortController()  # a Python tool's signal
        self._pending: list[Signalled] = []

    # -- cancel ------------------------------------------------------------------------------

    def cancel(self, stage: CancelStage) -> None:
        """Apply one stage of the grace timeline (synchronously; reports are sent after)."""
        if self.stop_started_at is None:
            self.stop_started_at = time.monotonic()
        tool = self.registry.get(self.run.tool)
        if tool is not None and tool.kind == "python":
            # Cooperative stop of a Python tool; SIGTERM/SIGKILL of the worker itself is the
            # supervisor's job (a worker cannot escalate against itself).
            self.controller.abort(User())
            if self.last_stage is None:
                self.last_stage = stage
            return
        # Once the leader is reaped the call is over and its sweep stops what is left; only a
        # KILL (force) still acts at once. ``pinned`` (not "the wait has returned") is the test:
        # the reaper may have reaped the leader a moment before this cancel arrived.
        if self.procs is None or not self.procs.pinned:
            if stage == "kill" and self.procs is not None:
                self._signal("kill", _signal.SIGKILL, group_only=False)
            return
        if stage == "interrupt":
            if not self.run.grace.interrupt:
                return
            self._signal(stage, _signal.SIGINT, group_only=True)
        elif stage == "term":
            self._signal(stage, _signal.SIGTERM, group_only=True)
        else:
            self._signal(stage, _signal.SIGKILL, group_only=False)
        self.last_stage = stage

    def _signal(self, stage: SignalStage, sig: int, *, group_only: bool) -> int:
        assert self.procs is not None
        targets = len(self.procs.stop(sig, group_only=group_only))
        self._pending.append(
            Signalled(call_id=self.run.call_id, stage=stage, at=self.elapsed(), targets=targets)
        )
        return targets

    async def flush_reports(self) -> None:
        pending, self._pending = self._pending, []
        for report in pending:
            await self.send(report)

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def sweep_delay(self) -> float:
        """How long the sweep waits between SIGTERM and SIGKILL."""
        kill_after = self.run.grace.kill_after
        if self.stop_started_at is None:
            return kill_after
        kill_deadline = self.stop_started_at + self.run.grace.kill_at
        left = kill_deadline - time.monotonic()
        return max(0.0, min(kill_after, left)) if math.isfinite(left) else kill_after


async def run_call(ctx: CallContext) -> Result:
    """Run the call to the end (normal or stopped) and return its result."""
    tool = ctx.registry.get(ctx.run.tool)
    if tool is None:
        return _not_run(ctx, ErrorCode.UNKNOWN_TOOL, f"unknown tool {ctx.run.tool!r}")
    try:
        arguments = validate_arguments(tool.parameters, ctx.run.arguments)
    except ArgumentError as e:
        return _not_run(ctx, ErrorCode.INVALID_ARGUMENTS, f"invalid arguments: {e}")
    if tool.kind == "shell":
        return await _run_shell(ctx, arguments)
    return await _run_python(ctx, tool, arguments)


def _not_run(ctx: CallContext, code: ErrorCode, message: str) -> Result:
    name = "UnknownTool" if code is ErrorCode.UNKNOWN_TOOL else "InvalidArguments"
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
        error=ErrorInfo(name=name, code=code, message=message),
    )


def internal_error_result(ctx: CallContext, error: Exception) -> Result:
    message = f"internal error in the worker: {type(error).__name__}: {error}"
    return Result(
        call_id=ctx.run.call_id,
        exit_code=None,
        exit_signal=None,
        ended_by=ctx.last_stage or "exit",
        content=f"Error: {message}",
        output_head=b"",
        output_tail=b"",
        output_bytes=0,
        duration=ctx.elapsed(),
        error=ErrorInfo(name="InternalError", code=ErrorCode.INTERNAL, message=message),
    )


def tool_environment(run: Run) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in run.env_remove}
    env.update(run.env_add)
    env["ANDON_CALL_ID"] = run.call_id
    env[TAG_VAR] = run.tag
    return env


async def _run_shell(ctx: CallContext, arguments: dict[str, Any]) -> Result:
    run = ctx.run
    command = str(arguments["command"])
    cwd = os.path.join(run.cwd, str(arguments.get("cwd") or "."))
    env = tool_environment(run)
    output = HeadTail(run.output_head_bytes, run.output_tail_bytes)
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    call_cgroup: Path | None = None
    try:
        if ctx.mode == "cgroup" and ctx.cgroups is not None:
            call_cgroup = ctx.cgroups.leaf(f"call-{run.tag}")
            # Enter the call's cgroup *before* spawning, so the tool is inside from its first
            # instruction (no preexec_fn, no race with its first forks), then step back out.
            CgroupTree.enter(call_cgroup)
        try:
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
        finally:
            if call_cgroup is not None and ctx.worker_cgroup is not None:
                CgroupTree.enter(ctx.worker_cgroup)
    except OSError as e:
        os.close(read_fd)
        os.close(write_fd)
        message = f"could not start bash: {e.strerror or e}"
        if e.errno == errno.ENOENT and not os.path.isdir(cwd):
            message = f"working directory {cwd} does not exist"
        return Result(
            call_id=run.call_id,
            exit_code=None,
            exit_signal=None,
            ended_by="not-run",
            content=f"Error: {message}",
            output_head=b"",
            output_tail=b"",
            output_bytes=0,
            duration=ctx.elapsed(),
            error=ErrorInfo(name="ToolError", code=ErrorCode.TOOL_ERROR, message=message),
        )
    os.close(write_fd)
    pid = popen.pid
    ctx.reaper.watch(pid)
    ctx.procs = CallProcesses(
        mode=ctx.mode,
        worker_pid=os.getpid(),
        reaper=ctx.reaper,
        pgid=pid,
        cgroup=call_cgroup,
        tag=_procs.tag_entry(run.tag),
    )
    # The leader is our unreaped child: its stat line is there even if it has already exited.
    leader = _procs.stat(pid)
    await ctx.send(
        Started(
            call_id=run.call_id,
            pid=pid,
            pgid=pid,
            create_time=leader.key.create_time if leader is not None else 0.0,
            containment=ctx.mode,
            cgroup=str(call_cgroup) if call_cgroup is not None else None,
        )
    )
    loop = asyncio.get_running_loop()
    os.set_blocking(read_fd, False)
    pending_sends: list[asyncio.Task[None]] = []
    eof = False

    def pump() -> bool:
        """Read what is there; return False at EOF."""
        nonlocal eof
        while True:
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

    loop.add_reader(read_fd, pump)
    try:
        status = await ctx.reaper.wait(pid)
        popen.returncode = status.code if status.code is not None else -(status.signal or 0)
        ended_by: EndedBy = ctx.last_stage or "exit"
        strays = await _sweep(ctx)
        if not eof:
            pump()  # the writers are gone: take what is left in the pipe, without waiting
        unreachable = len(ctx.procs.unreachable()) if ctx.mode == "pgroup" else 0
    finally:
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
        unreachable=unreachable,
    )


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
        return 0
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
    assert tool.fn is not None
    kwargs = dict(arguments)
    if tool.takes_signal:
        kwargs["signal"] = ctx.controller.signal
    error: ErrorInfo | None = None
    content = ""
    ended_by: EndedBy = "exit"
    await ctx.send(
        Started(
            call_id=run.call_id,
            pid=os.getpid(),
            pgid=os.getpgid(0),
            create_time=_procs.own_key().create_time,
            containment=ctx.mode,
        )
    )
    os.chdir(run.cwd)
    saved_env = _apply_env(run)
    try:
        if tool.is_async:
            value = await tool.fn(**kwargs)
        else:
            loop = asyncio.get_running_loop()
            value = await loop.run_in_executor(None, partial(tool.fn, **kwargs))
        content = "" if value is None else str(value)
        if ctx.last_stage is not None:
            ended_by = ctx.last_stage
    except Aborted as e:
        ended_by = ctx.last_stage or "interrupt"
        message = "tool call aborted"
        content = f"Error: {message} ({e.reason.describe()})"
        error = ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message=message)
    except Exception as e:  # a tool's own failure is a result, not a worker crash
        ended_by = ctx.last_stage or "exit"
        message = f"{type(e).__name__}: {e}"
        content = f"Error: {message}"
        error = ErrorInfo(name="ToolError", code=ErrorCode.TOOL_ERROR, message=message)
    finally:
        _restore_env(saved_env)
    ctx.procs = CallProcesses(mode=ctx.mode, worker_pid=os.getpid(), reaper=ctx.reaper)
    strays = await _sweep(ctx)
    await ctx.flush_reports()
    data = content.encode("utf-8", "replace")
    return Result(
        call_id=run.call_id,
        exit_code=None,
        exit_signal=None,
        ended_by=ended_by,
        content=content,
        output_head=b"",
        output_tail=b"",
        output_bytes=len(data),
        duration=ctx.elapsed(),
        error=error,
        strays_killed=strays,
    )


def _apply_env(run: Run) -> dict[str, str | None]:
    """Give a Python tool the same environment rules as a shell tool, for the call's length."""
    changes: dict[str, str | None] = {"ANDON_CALL_ID": run.call_id, TAG_VAR: run.tag, **run.env_add}
    for name in run.env_remove:
        changes[name] = None
    saved = {name: os.environ.get(name) for name in changes}
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return saved


def _restore_env(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def kill_everything(ctx: CallContext | None, reaper: Reaper, mode: ContainmentMode) -> None:
    """Emergency stop (the supervisor vanished): SIGKILL the call's group, strays and cgroup."""
    if ctx is not None and ctx.procs is not None:
        ctx.procs.signal(_signal.SIGKILL)
    everything = CallProcesses(mode="subreaper", worker_pid=os.getpid(), reaper=reaper)
    everything.signal(_signal.SIGKILL)
