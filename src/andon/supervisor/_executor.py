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
from typing import Any

from andon.base import (
    Aborted,
    AbortSignal,
    Cause,
    Clock,
    ErrorCode,
    GracePolicy,
    SystemClock,
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
from andon.supervisor._outcome import ToolOutcome, not_run, status_line
from andon.supervisor._pool import WorkerGone, WorkerLease, WorkerPool
from andon.supervisor._render import lost_content, python_content, shell_content
from andon.supervisor._spill import DEFAULT_SPILL_CAP, Spill
from andon.supervisor._timeline import STAGES, Lost, Running, Stopping, Timeline, Why
from andon.workers import ArgumentError, Tool, ToolRegistry, validate_arguments

__all__ = ["ExecutionObserver", "ToolCallRequest", "ToolExecutor", "aborted_before_dispatch"]


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
    """One dispatched call: its events, its timeline, and its outcome."""

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
        self.t0 = 0.0  # when the run was sent, on the executor's clock
        self.timeline: Timeline = Running(0.0, self.timeout)
        self.result_received = False
        self.started: Started | None = None
        self.acked = 0  # output bytes consumed, as the worker was last told
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

    @property
    def stop(self) -> Stopping | None:
        """The stop under way (or the one under way when the worker was lost)."""
        timeline = self.timeline
        if isinstance(timeline, Lost):
            return timeline.stop
        return timeline if isinstance(timeline, Stopping) else None

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
            self.timeline = Running(self.t0, self.timeout)
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
                consumed = item.offset + len(item.data)
                if consumed - self.acked >= OUTPUT_WINDOW // 4:
                    self.acked = consumed
                    await self.lease.send(Ack(call_id=self.request.call_id, offset=self.acked))
            case Signalled():
                self.observer.on_signal(item.call_id, item.stage, item.at, item.targets)
            case Result():
                self.result_received = True
                return self._from_result(item)
            case ErrorReply():
                # The worker refused or failed to read our message: broken means dead.
                self._lose(f"the worker answered an error: {item.reason}")
            case WorkerGone():
                return self._from_worker_gone(item)
            case _Abort():
                if isinstance(self.timeline, Running):
                    await self._begin_stop("abort", self.signal.reason)
            case _Force():
                while isinstance(self.timeline, Stopping) and (
                    (stage := self.timeline.next_stage()) is not None
                ):
                    await self._send_stage(stage)
                self._schedule()
            case _Tick():
                await self._on_tick()
        return None

    def _lose(self, reason: str) -> None:
        if not isinstance(self.timeline, Lost):
            self.timeline = Lost(reason, self.stop)
            self.lease.kill(reason)

    async def _begin_stop(self, why: Why, cause: Cause | None) -> None:
        assert isinstance(self.timeline, Running)
        now = self.clock.monotonic()
        # A Python tool's first stage is its signal, whatever ``interrupt`` says of SIGINT.
        self.timeline = self.timeline.stop(
            why, cause, now, interrupt=self.grace.interrupt or self.python
        )
        await self._on_tick()

    async def _on_tick(self) -> None:
        now = self.clock.monotonic()
        timeline = self.timeline
        if isinstance(timeline, Running):
            deadline = timeline.deadline()
            if deadline is not None and now >= deadline:
                await self._begin_stop("timeout", None)
                return
        elif isinstance(timeline, Stopping):
            while (
                isinstance(self.timeline, Stopping)
                and (stage := self.timeline.due(now, self.grace)) is not None
            ):
                await self._send_stage(stage)
            stopping = self.timeline
            if (
                isinstance(stopping, Stopping)
                and stopping.kill_sent_at is not None
                and now >= stopping.kill_sent_at + self.ex.kill_ack_timeout
            ):
                self._lose(
                    f"the worker did not report the call's end within "
                    f"{self.ex.kill_ack_timeout:g}s of SIGKILL"
                )
        self._schedule()

    async def _send_stage(self, stage: CancelStage) -> None:
        stopping = self.timeline
        assert isinstance(stopping, Stopping)
        now = self.clock.monotonic()
        after = stopping.send(stage, now)
        if after is stopping:
            return
        self.timeline = after
        await self.lease.send(
            Cancel(
                call_id=self.request.call_id,
                stage=stage,
                cause=after.cause.to_dict() if after.cause is not None else None,
                kill_in=after.kill_in(now, self.grace),
            )
        )

    def _schedule(self) -> None:
        """Arm one timer for the next deadline on the clock."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        timeline = self.timeline
        if isinstance(timeline, Running):
            deadline = timeline.deadline()
        elif isinstance(timeline, Stopping):
            deadline = timeline.deadline(self.grace, self.ex.kill_ack_timeout)
        else:
            deadline = None
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
        stop = self.stop
        if stop is not None and stop.why == "timeout" and stage in STAGES:
            return f"timeout-{stage}"
        return stage

    def _stop_error(self) -> ErrorInfo | None:
        stop = self.stop
        if stop is None:
            return None
        if stop.why == "abort":
            return ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message="tool call aborted")
        return ErrorInfo(
            name="ToolTimeout",
            code=ErrorCode.TOOL_TIMEOUT,
            message=f"tool call timed out after {self.timeout:g}s",
        )

    def _status(self, exit_code: int | None, exit_signal: int | None) -> str:
        stop = self.stop
        return status_line(
            reason=stop.why if stop is not None else None,
            cause=stop.cause if stop is not None else None,
            timeout=self.timeout,
            stages=stop.sent if stop is not None else (),
            exit_code=exit_code,
            exit_signal=exit_signal,
            since_stop=self.clock.monotonic() - stop.began if stop is not None else None,
            python=self.python,
        )

    def _from_result(self, result: Result) -> ToolOutcome:
        duration = self.clock.monotonic() - self.t0
        if (
            result.ended_by == "not-run"
            and result.error is not None
            and result.error.code is ErrorCode.ABORTED_BEFORE_DISPATCH
        ):
            # The cancel reached the worker before the spawn: the tool never started.
            return aborted_before_dispatch(self.request.call_id)
        # A call that ended on its own before the stop reached it keeps its own result.
        stopped = self.stop is not None and result.ended_by != "exit"
        error = self._stop_error() if stopped else result.error
        ended_by = self._ended_by(result.ended_by) if stopped else result.ended_by
        if self.python:
            content = python_content(
                result.content,
                stopped=stopped,
                failed=error is not None,
                status=self._status(None, None) if stopped else "",
            )
        else:
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
            content = shell_content(result, self.spill, status)
        failed = result.exit_code not in (None, 0) or result.exit_signal is not None
        stop = self.stop
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
            stages=stop.sent if stop is not None else (),
        )

    def _from_worker_gone(self, gone: WorkerGone) -> ToolOutcome:
        duration = self.clock.monotonic() - self.t0
        timeline = self.timeline
        reason = timeline.reason if isinstance(timeline, Lost) else gone.reason
        message = f"worker lost: {reason}; andon killed the call's processes"
        stop = self.stop
        return ToolOutcome(
            call_id=self.request.call_id,
            content=lost_content(self.spill, message),
            is_error=True,
            ended_by="worker-lost",
            duration=duration,
            error=ErrorInfo(name="WorkerLost", code=ErrorCode.WORKER_LOST, message=message),
            output_bytes=self.spill.total,
            output_file=self.spill.relpath,
            started=self.started,
            stages=stop.sent if stop is not None else (),
        )
