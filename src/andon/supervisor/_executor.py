"""The tool executor: dispatches calls to workers and owns the grace timeline.

The executor holds the clock. When a started call must stop (its turn's signal aborted, or its own
timeout elapsed) it sends the worker the stages of the timeline — interrupt at once, term at
``term_after``, kill at ``term_after + kill_after`` — and keeps waiting for the real result: it
drains, it never abandons. A Python tool runs in a call process of its own (forked by the worker),
so its stages travel like a shell call's: the worker signals the call's process group, and the
worker itself is never signalled on purpose. Each ``cancel`` carries the cause (a Python tool's
signal aborts with it) and how far off KILL is, so the worker keeps no timeline of its own.

Everything that can happen to a call arrives on one queue (worker messages, the abort, ``force``,
timer ticks), so the timeline is a single sequential loop with no races between its branches.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from andon.base import (
    Aborted,
    AbortSignal,
    Cause,
    Clock,
    ErrorCode,
    GracePolicy,
    SystemClock,
    Timeout,
    call_tag,
    executor_id,
)
from andon.protocol import (
    OUTPUT_WINDOW,
    Ack,
    Cancel,
    CancelStage,
    ErrorInfo,
    ErrorReply,
    Output,
    Result,
    Run,
    Signalled,
    Started,
)
from andon.supervisor._outcome import StageMark, ToolOutcome, format_output, not_run, status_line
from andon.supervisor._pool import WorkerGone, WorkerLease, WorkerPool
from andon.supervisor._spill import DEFAULT_SPILL_CAP, Spill
from andon.workers import ArgumentError, Tool, ToolRegistry, validate_arguments

__all__ = ["ExecutionObserver", "ToolCallRequest", "ToolExecutor", "aborted_before_dispatch"]

_STAGES: tuple[CancelStage, ...] = ("interrupt", "term", "kill")


@dataclass(frozen=True)
class ToolCallRequest:
    call_id: str
    name: str
    arguments: str | Mapping[str, Any]  # the model's argument string, passed through untouched
    cwd: str
    # The session the call belongs to; with the call id it makes the call's process tag. None: the
    # executor's own identity.
    owner: str | None = None


class ExecutionObserver:
    """Callbacks for the live events of a call (the agent writes them to the log)."""

    def on_started(self, started: Started, worker: str) -> None:
        """Worker ``worker`` reports the tool's process exists (``tool/started``)."""

    def on_signal(self, call_id: str, stage: str, at: float, targets: int) -> None:
        """A grace stage or sweep signal was sent (``tool/signal``)."""

    def on_output(self, call_id: str, data: bytes) -> None:
        """A chunk of output (live ``tool/output``)."""


class _Tick:
    pass


class _Abort:
    pass


class _Force:
    pass


_TICK, _ABORT, _FORCE = _Tick(), _Abort(), _Force()


def aborted_before_dispatch(call_id: str) -> ToolOutcome:
    return not_run(
        call_id,
        ErrorCode.ABORTED_BEFORE_DISPATCH,
        "Aborted",
        "tool call aborted before dispatch",
    )


class ToolExecutor:
    def __init__(
        self,
        pool: WorkerPool,
        registry: ToolRegistry,
        *,
        grace: GracePolicy | None = None,
        clock: Clock | None = None,
        default_timeout: float | None = None,
        max_timeout: float | None = None,
        session_dir: Path | None = None,
        head_bytes: int = 8 * 1024,
        tail_bytes: int = 8 * 1024,
        env_add: Mapping[str, str] | None = None,
        env_remove: tuple[str, ...] = (),
        kill_ack_timeout: float = 10.0,
        identity: str | None = None,
        spill_cap: int = DEFAULT_SPILL_CAP,
    ) -> None:
        self.pool = pool
        self.spill_cap = spill_cap
        # Who owns the calls this executor starts: with the call id it makes each call's tag, the
        # mark that every process of the call carries and that the stop paths and crash repair
        # find it by. A session passes its id (repair derives the tag from the log); otherwise a
        # fresh random id keeps two executors with the same call ids apart.
        self.identity = identity or executor_id()
        self.registry = registry
        self.grace = grace or GracePolicy()
        self.clock: Clock = clock or SystemClock()
        self.default_timeout = default_timeout
        self.max_timeout = max_timeout
        self.session_dir = session_dir
        self.head_bytes = head_bytes
        self.tail_bytes = tail_bytes
        self.env_add = dict(env_add or {})
        self.env_remove = env_remove
        self.kill_ack_timeout = kill_ack_timeout
        self._inflight: set[asyncio.Queue[object]] = set()

    # -- before dispatch ---------------------------------------------------------------------

    def prepare(self, request: ToolCallRequest) -> tuple[Tool, dict[str, Any]] | ToolOutcome:
        """Look the tool up and validate the arguments; a bad call becomes a not-run outcome."""
        tool = self.registry.get(request.name)
        if tool is None:
            known = ", ".join(self.registry.names) or "none"
            return not_run(
                request.call_id,
                ErrorCode.UNKNOWN_TOOL,
                "UnknownTool",
                f"unknown tool {request.name!r} (available: {known})",
            )
        try:
            arguments = validate_arguments(tool.parameters, request.arguments)
        except ArgumentError as e:
            return not_run(
                request.call_id,
                ErrorCode.INVALID_ARGUMENTS,
                "InvalidArguments",
                f"invalid arguments for {tool.name}: {e}",
            )
        return tool, arguments

    def timeout_for(self, tool: Tool, arguments: Mapping[str, Any]) -> float | None:
        """The call's own timeout: its argument (capped), else the tool's, else the default."""
        cap = tool.max_timeout if tool.max_timeout is not None else self.max_timeout
        requested = arguments.get("timeout") if tool.kind == "shell" else None
        if isinstance(requested, int | float) and requested > 0:
            value: float | None = float(requested)
        else:
            value = tool.timeout if tool.timeout is not None else self.default_timeout
        if value is not None and cap is not None:
            value = min(value, cap)
        return value

    def force(self) -> None:
        """Skip the rest of the grace period of every call being stopped: kill now."""
        for queue in list(self._inflight):
            queue.put_nowait(_FORCE)

    # -- one call ----------------------------------------------------------------------------

    async def execute(
        self,
        request: ToolCallRequest,
        signal: AbortSignal,
        observer: ExecutionObserver | None = None,
    ) -> ToolOutcome:
        """Run one call to its end and return its outcome; never raises for the call's fate."""
        prepared = self.prepare(request)
        if isinstance(prepared, ToolOutcome):
            return prepared
        tool, arguments = prepared
        if signal.aborted:
            return aborted_before_dispatch(request.call_id)
        try:
            lease = await self.pool.acquire(signal)
        except Aborted:
            return aborted_before_dispatch(request.call_id)
        run = _RunningCall(
            self, request, tool, arguments, lease, signal, observer or ExecutionObserver()
        )
        self._inflight.add(lease.messages)
        try:
            return await run.drive()
        finally:
            self._inflight.discard(lease.messages)
            if lease.alive and run.result_received:
                lease.release()


class _RunningCall:
    """The timeline of one dispatched call."""

    def __init__(
        self,
        executor: ToolExecutor,
        request: ToolCallRequest,
        tool: Tool,
        arguments: dict[str, Any],
        lease: WorkerLease,
        signal: AbortSignal,
        observer: ExecutionObserver,
    ) -> None:
        self.ex = executor
        self.request = request
        self.tool = tool
        self.arguments = arguments
        self.lease = lease
        self.signal = signal
        self.observer = observer
        self.grace = tool.grace or executor.grace
        self.timeout = executor.timeout_for(tool, arguments)
        self.queue: asyncio.Queue[object] = lease.messages
        self.clock = executor.clock
        self.t0 = 0.0
        self.stop_reason: Literal["abort", "timeout"] | None = None
        self.stop_t: float | None = None
        self.stop_cause: Cause | None = None
        self.next_stage = 0  # index into _STAGES of the next stage to send
        self.marks: list[StageMark] = []
        self.kill_sent_at: float | None = None
        self.lost_reason: str | None = None
        self.result_received = False
        self.started: Started | None = None
        self.consumed = 0  # output bytes spilled so far
        self.acked = 0  # what the worker was last told of it
        self.spill = Spill(
            executor.session_dir,
            request.call_id,
            executor.head_bytes + executor.tail_bytes,
            executor.spill_cap,
        )
        self._timer: asyncio.Task[None] | None = None

    @property
    def python(self) -> bool:
        return self.tool.kind == "python"

    async def drive(self) -> ToolOutcome:
        handle = self.signal.add_callback(lambda _cause: self.queue.put_nowait(_ABORT))
        try:
            env_add = {**self.ex.env_add, "ANDON_CALL_ID": self.request.call_id}
            tag = call_tag(self.request.owner or self.ex.identity, self.request.call_id)
            self.lease.tag = tag
            run = Run(
                call_id=self.request.call_id,
                tool=self.tool.name,
                tag=tag,
                arguments=self.arguments,
                cwd=self.request.cwd,
                timeout=self.timeout,
                grace=self.grace,
                output_head_bytes=self.ex.head_bytes,
                output_tail_bytes=self.ex.tail_bytes,
                env_add=env_add,
                env_remove=self.ex.env_remove,
            )
            self.t0 = self.clock.monotonic()
            await self.lease.send(run)  # from here on the call counts as started
            self._schedule()
            while True:
                item = await self.queue.get()
                outcome = await self._handle(item)
                if outcome is not None:
                    return outcome
        finally:
            handle.remove()
            if self._timer is not None:
                self._timer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._timer
            self.spill.close()

    # -- events ------------------------------------------------------------------------------

    async def _handle(self, item: object) -> ToolOutcome | None:
        match item:
            case Started():
                self.started = item
                self.observer.on_started(item, self.lease.worker_id)
            case Output():
                self.spill.add(item.data)
                self.observer.on_output(item.call_id, item.data)
                # Consumed: move the worker's window on (a quarter at a time, not per chunk).
                self.consumed = item.offset + len(item.data)
                if self.consumed - self.acked >= OUTPUT_WINDOW // 4:
                    self.acked = self.consumed
                    await self.lease.send(Ack(call_id=self.request.call_id, offset=self.acked))
            case Signalled():
                self.observer.on_signal(item.call_id, item.stage, item.at, item.targets)
            case Result():
                self.result_received = True
                return self._from_result(item)
            case ErrorReply():
                # The worker refused or failed to read our message: broken means dead.
                self.lost_reason = f"the worker answered an error: {item.reason}"
                self.lease.kill(self.lost_reason)
            case WorkerGone():
                return self._from_worker_gone(item)
            case _Abort():
                if self.stop_reason is None:
                    self.stop_cause = self.signal.reason
                    await self._begin_stop("abort")
            case _Force():
                if self.stop_reason is not None:
                    while self.next_stage < len(_STAGES):
                        await self._send_stage(_STAGES[self.next_stage])
            case _Tick():
                await self._on_tick()
        return None

    async def _begin_stop(self, reason: Literal["abort", "timeout"]) -> None:
        self.stop_reason = reason
        self.stop_t = self.clock.monotonic()
        if self.grace.interrupt or self.python:
            await self._send_stage("interrupt")
        else:
            self.next_stage = 1
        await self._on_tick()

    async def _on_tick(self) -> None:
        now = self.clock.monotonic()
        if self.stop_reason is None:
            if self.timeout is not None and now >= self.t0 + self.timeout:
                await self._begin_stop("timeout")
                return
        else:
            assert self.stop_t is not None
            deadlines = (0.0, self.grace.term_after, self.grace.kill_at)
            while (
                self.next_stage < len(_STAGES) and now >= self.stop_t + deadlines[self.next_stage]
            ):
                await self._send_stage(_STAGES[self.next_stage])
            if (
                self.kill_sent_at is not None
                and self.lost_reason is None
                and now >= self.kill_sent_at + self.ex.kill_ack_timeout
            ):
                self.lost_reason = (
                    f"the worker did not report the call's end within "
                    f"{self.ex.kill_ack_timeout:g}s of SIGKILL"
                )
                self.lease.kill(self.lost_reason)
        self._schedule()

    async def _send_stage(self, stage: CancelStage) -> None:
        index = _STAGES.index(stage)
        if index < self.next_stage:
            return
        self.next_stage = index + 1
        now = self.clock.monotonic()
        assert self.stop_t is not None
        self.marks.append(StageMark(stage, now - self.stop_t))
        if stage == "kill":
            self.kill_sent_at = now
        await self.lease.send(
            Cancel(
                call_id=self.request.call_id,
                stage=stage,
                cause=self._wire_cause(),
                kill_in=max(0.0, self.stop_t + self.grace.kill_at - now),
            )
        )

    def _wire_cause(self) -> dict[str, Any] | None:
        """What a Python tool's signal aborts with: the turn's cause, or its own timeout."""
        if self.stop_reason == "timeout" and self.timeout is not None:
            return Timeout(self.timeout).to_dict()
        return self.stop_cause.to_dict() if self.stop_cause is not None else None

    def _schedule(self) -> None:
        """Arm one timer for the next deadline on the clock."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline: float | None = None
        if self.stop_reason is None:
            if self.timeout is not None:
                deadline = self.t0 + self.timeout
        else:
            assert self.stop_t is not None
            deadlines = (0.0, self.grace.term_after, self.grace.kill_at)
            if self.next_stage < len(_STAGES):
                deadline = self.stop_t + deadlines[self.next_stage]
            elif self.kill_sent_at is not None and self.lost_reason is None:
                deadline = self.kill_sent_at + self.ex.kill_ack_timeout
        if deadline is None or not math.isfinite(deadline):
            return
        self._timer = asyncio.get_running_loop().create_task(self._tick_at(deadline))

    async def _tick_at(self, deadline: float) -> None:
        # The delay is computed when the task runs, not when it was created: the clock may have
        # moved in between (a test's manual clock, or a slow loop).
        await self.clock.sleep(max(0.0, deadline - self.clock.monotonic()))
        self.queue.put_nowait(_TICK)

    # -- outcomes ----------------------------------------------------------------------------

    def _ended_by(self, stage: str) -> Any:
        if self.stop_reason == "timeout" and stage in _STAGES:
            return f"timeout-{stage}"
        return stage

    def _stop_error(self) -> ErrorInfo | None:
        if self.stop_reason == "abort":
            return ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message="tool call aborted")
        if self.stop_reason == "timeout":
            return ErrorInfo(
                name="ToolTimeout",
                code=ErrorCode.TOOL_TIMEOUT,
                message=f"tool call timed out after {self.timeout:g}s",
            )
        return None

    def _since_stop(self) -> float | None:
        return None if self.stop_t is None else self.clock.monotonic() - self.stop_t

    def _from_result(self, result: Result) -> ToolOutcome:
        duration = self.clock.monotonic() - self.t0
        if (
            result.ended_by == "not-run"
            and result.error is not None
            and result.error.code is ErrorCode.ABORTED_BEFORE_DISPATCH
        ):
            # The cancel reached the worker before the spawn: the tool never started.
            return aborted_before_dispatch(self.request.call_id)
        stopped = self.stop_reason is not None and result.ended_by != "exit"
        error = result.error
        if stopped:
            error = self._stop_error()
        elif error is None and self.stop_reason is not None and self.python:
            pass  # the Python tool finished on its own before the stop reached it
        ended_by = self._ended_by(result.ended_by) if stopped else result.ended_by
        if self.python:
            content = result.content
            if stopped and error is not None and not content.startswith("Error:"):
                content = f"{content}\n" if content else ""
                content += "Error: tool call stopped"
            if stopped:
                content += "\n" + self._status(None, None, python=True)
        else:
            parts = [
                format_output(
                    result.output_head, result.output_tail, result.output_bytes, self.spill.relpath
                )
            ]
            status = (
                self._status(result.exit_code, result.exit_signal)
                if stopped
                else status_line(
                    reason=None,
                    cause=None,
                    timeout=None,
                    stages=(),
                    exit_code=result.exit_code,
                    exit_signal=result.exit_signal,
                    since_stop=None,
                )
            )
            if parts[0] and not parts[0].endswith("\n"):
                parts[0] += "\n"
            parts.append(status)
            if result.strays_killed:
                parts.append(
                    f"\n[andon stopped {result.strays_killed} background "
                    f"process{'es' if result.strays_killed != 1 else ''} this command left running]"
                )
            if self.spill.note():
                parts.append("\n" + self.spill.note())
            if result.unreachable:
                parts.append(
                    f"\n[andon could not stop {result.unreachable} process"
                    f"{'es' if result.unreachable != 1 else ''} this command left running: "
                    f"containment mode 'pgroup' cannot reach processes that left the process group]"
                )
            content = "".join(parts)
        failed = result.exit_code not in (None, 0) or result.exit_signal is not None
        return ToolOutcome(
            call_id=self.request.call_id,
            content=content,
            is_error=error is not None or failed,
            ended_by=ended_by,
            duration=duration,
            error=error,
            exit_code=result.exit_code,
            exit_signal=result.exit_signal,
            ran=not self.python and result.ended_by != "not-run",
            strays_killed=result.strays_killed,
            unreachable=result.unreachable,
            output_bytes=self.spill.total if not self.python else result.output_bytes,
            output_file=self.spill.relpath,
            started=self.started,
            stages=tuple(self.marks),
        )

    def _status(
        self, exit_code: int | None, exit_signal: int | None, *, python: bool = False
    ) -> str:
        return status_line(
            reason=self.stop_reason,
            cause=self.stop_cause,
            timeout=self.timeout,
            stages=tuple(self.marks),
            exit_code=exit_code,
            exit_signal=exit_signal,
            since_stop=self._since_stop(),
            python=python,
        )

    def _from_worker_gone(self, gone: WorkerGone) -> ToolOutcome:
        duration = self.clock.monotonic() - self.t0
        output = format_output(self.spill.head(), b"", self.spill.total, self.spill.relpath)
        if output and not output.endswith("\n"):
            output += "\n"
        if self.spill.note():
            output += self.spill.note() + "\n"
        reason = self.lost_reason or gone.reason
        message = f"worker lost: {reason}; andon killed the call's processes"
        return ToolOutcome(
            call_id=self.request.call_id,
            content=output + f"Error: {message}",
            is_error=True,
            ended_by="worker-lost",
            duration=duration,
            error=ErrorInfo(name="WorkerLost", code=ErrorCode.WORKER_LOST, message=message),
            output_bytes=self.spill.total,
            output_file=self.spill.relpath,
            started=self.started,
            stages=tuple(self.marks),
        )
