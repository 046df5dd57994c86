"""The tool executor: dispatches calls to workers and walks the grace ladder of every stop.

The executor holds the clock. When a started call must stop (its turn's signal aborted, or its own
timeout elapsed) it sends the worker the stages of the timeline — interrupt at once, term at
``term_after``, kill at ``term_after + kill_after`` — and keeps waiting for the real result: it
drains, it never abandons. A Python tool runs in a call process of its own (forked by the worker),
so its stages travel like a shell call's: the worker signals the call's process group, and the
worker itself is never signalled on purpose. Each ``cancel`` carries the cause (a Python tool's
signal aborts with it) and how far off KILL is, so the worker keeps no timeline of its own.

Everything that can happen to a call arrives on one queue (worker messages, the abort, ``force``,
timer ticks), so the timeline is a single sequential loop with no races between its branches.
What the abort, a force, a tick or a worker given up on do to the call is decided by one pure
function, :meth:`GraceLadder.step` (``andon.base``): it returns the call's next timeline and the
actions to take, and :meth:`_RunningCall._apply` takes them, in order, in one place. Timers are
:meth:`Clock.call_at` callbacks that put a tick on that queue: no task per timer.

**Who may change what, and when.** Only the call's own task (:meth:`_RunningCall.drive`) changes
a call's timeline. The abort callback, :meth:`ToolExecutor.force`, the timer and the pool never
touch it: they only put an item on the queue, synchronously. So a cancel that lands "between two
lines" of the loop changes nothing there; it is an ``_ABORT`` waiting its turn, handled after
the item in hand. The loop does await inside an item (sends to the worker), and items that
arrive meanwhile wait too: each item is handled to its end, in arrival order, and every branch
re-reads ``self.timeline`` after an await instead of trusting what it saw before it (a send that
fails turns the timeline ``Lost``). Ticks carry no meaning of their own: each one re-reads the
clock and the timeline and does what is due now, so a tick from a timer that was replaced, or
two ticks in a row, do nothing wrong. At most one timer is armed, for the timeline's next
deadline, and every step that may move that deadline re-arms it (an ``ArmTimer`` action).

**Every call is answered, and nothing of it outlives its answer.** A bad call is answered before
any worker is taken: arguments the wire cannot carry (an integer beyond 64 bits, a lone surrogate
in a string, nesting deeper than the protocol takes, a message over the size limit) are
``INVALID_ARGUMENTS`` naming the field, like any argument that fails the schema: the model sent
them and can send better ones, and nothing about them is an andon bug. A failure *inside* the
executor once the call is dispatched (an observer callback that raises, the spill, building the
outcome, a message that cannot be sent, the clock) is andon's: the call is stopped by the same
ladder as a cancel (or, when the worker can no longer be told, by killing the worker with the
call's processes), and answered ``INTERNAL``, its content starting ``Error:`` and naming what
failed. Its worker goes back to the pool when it is known to be idle (its result came through, or
nothing was sent), and is retired otherwise. A cancel still wins: if the turn's signal aborted,
the call's real drained result is its answer.

(The module is larger than most: one call's whole life — validation for the wire, dispatch, the
timeline and every way it can end — stays in one place so that no path can skip its answer.)
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, final

from andon.base import (
    CANCEL_STAGES,
    Aborted,
    AbortSignal,
    AnswerLost,
    ArmTimer,
    BeginStop,
    Clock,
    ErrorCode,
    Force,
    GraceLadder,
    GracePolicy,
    Hook,
    LadderEvent,
    Lost,
    MessageTooLarge,
    RetireWorker,
    Running,
    SendStage,
    SignalStage,
    Stopping,
    SystemClock,
    Tick,
    Timeline,
    Timer,
    WorkerError,
    WriteOff,
    call_tag,
    describe_error,
    executor_id,
    show_name,
)
from andon.fleet import WorkerGone, WorkerLease, WorkerPool
from andon.protocol import (
    MAX_JSON_DEPTH,
    OUTPUT_WINDOW,
    Ack,
    Cancel,
    ErrorInfo,
    ErrorReply,
    Message,
    Output,
    Result,
    Run,
    Signalled,
    Started,
    encode,
)
from andon.supervisor._outcome import ToolOutcome, not_run, status_line
from andon.supervisor._render import lost_content, python_content, shell_content
from andon.supervisor._spill import DEFAULT_SPILL_CAP, Spill
from andon.workers import ArgumentError, Tool, ToolRegistry, validate_arguments

__all__ = [
    "ExecutionObserver",
    "TimeoutChoice",
    "ToolCallRequest",
    "ToolExecutor",
    "aborted_before_dispatch",
]


@final
@dataclass(frozen=True)
class ToolCallRequest:
    call_id: str
    name: str
    arguments: str | Mapping[str, Any]  # the model's argument string, passed through untouched
    cwd: str
    # The session the call belongs to; with the call id it makes the call's process tag. None: the
    # executor's own identity.
    owner: str | None = None
    # How this one call is stopped, over the tool's and the executor's policy (None: theirs). An
    # MCP server's host call stops on its own timeline (docs/tools.md, MCP servers).
    grace: GracePolicy | None = None


@dataclass(frozen=True)
class TimeoutChoice:
    """A call's own timeout (:meth:`ToolExecutor.timeout_choice`); ``asked`` is set when the
    model asked for more than ``cap`` and got ``cap``."""

    seconds: float | None
    asked: float | None = None
    cap: float | None = None

    def note(self, tool: str) -> str:
        """The line the result's content ends with when the model's argument was clamped
        (the model must learn its build got less time than it asked for), else ``""``."""
        if self.asked is None or self.cap is None:
            return ""
        asked = "no limit asked" if math.isinf(self.asked) else f"{_secs(self.asked)} asked"
        return f"[timeout: {asked}, capped at {_secs(self.cap)} (the most {tool} may run here)]"


def _secs(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.0f}s" if value == round(value) else f"{round(value, 2):g}s"


class ExecutionObserver:
    """Callbacks for the live events of a call (the agent writes them to the log)."""

    def on_started(self, started: Started, worker: str) -> None:
        """Worker ``worker`` reports the tool's process exists (``tool/started``)."""

    def on_signal(self, call_id: str, stage: SignalStage, at: float, targets: int) -> None:
        """A grace stage or sweep signal was sent (``tool/signal``)."""

    def on_output(self, call_id: str, data: bytes) -> None:
        """A chunk of output (live ``tool/output``)."""


class _Tick:
    """A timer fired. It names no deadline: the loop re-reads the clock and does what is due."""


class _Abort:
    """The turn's signal aborted. The cause is read from the signal when the item is handled; a
    signal fires once, so a call gets at most one of these."""


class _Force:
    """Skip the rest of the grace period (a second Ctrl-C)."""


_TICK, _ABORT, _FORCE = _Tick(), _Abort(), _Force()

_log = logging.getLogger("andon.executor")

# What msgpack can carry as an integer (the wire's own range): a model can write any JSON number.
_WIRE_INT_MIN, _WIRE_INT_MAX = -(2**63), 2**64 - 1

_INTERNAL_CAUSE = Hook("internal error in andon")
"""What a Python tool's signal aborts with when the executor stops a call after its own failure."""


class _Failure(Exception):
    """One step of a running call failed; names the step. Never leaves this module."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(f"{what} failed: {describe_error(error)}")


def aborted_before_dispatch(call_id: str) -> ToolOutcome:
    return not_run(
        call_id,
        ErrorCode.ABORTED_BEFORE_DISPATCH,
        "Aborted",
        "tool call aborted before dispatch",
    )


def _internal_not_run(call_id: str, failure: str) -> ToolOutcome:
    return not_run(
        call_id,
        ErrorCode.INTERNAL,
        "InternalError",
        f"internal error in andon's executor: {failure}; the call did not run",
    )


def _invalid(call_id: str, tool: Tool, problem: str) -> ToolOutcome:
    return not_run(
        call_id,
        ErrorCode.INVALID_ARGUMENTS,
        "InvalidArguments",
        f"invalid arguments for {tool.name}: {problem}",
    )


def _check_wire_arguments(arguments: Mapping[str, Any]) -> None:
    """Raise :class:`ArgumentError`, naming the field, if the wire cannot carry ``arguments``
    to a worker as the model wrote them (the worker would get something else, or nothing)."""
    for name, value in arguments.items():
        _check_wire_key(name, "arguments")
        _check_wire(value, name, 1)


def _check_wire_key(key: object, where: str) -> None:
    if not isinstance(key, str):
        raise ArgumentError(f"{where} has a key that is not a string: {key!r}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArgumentError(
            f"{where} has a key that is not valid Unicode text (a lone surrogate at {e.start})",
            field=key,
        ) from None


def _check_wire(value: object, path: str, depth: int) -> None:
    if value is None or isinstance(value, bool | float):
        return
    if isinstance(value, int):
        if not _WIRE_INT_MIN <= value <= _WIRE_INT_MAX:
            raise ArgumentError(
                f"field {path!r} is an integer beyond 64 bits, which andon cannot pass to a tool",
                field=path,
            )
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ArgumentError(
                f"field {path!r} is not valid Unicode text (a lone surrogate at position "
                f"{e.start})",
                field=path,
            ) from None
        return
    if isinstance(value, list | tuple | dict) and depth >= MAX_JSON_DEPTH:
        raise ArgumentError(f"field {path!r} nests deeper than {MAX_JSON_DEPTH} levels", field=path)
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_wire(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_wire_key(key, f"field {path!r}")
            _check_wire(item, f"{path}.{key}", depth + 1)
        return
    raise ArgumentError(f"field {path!r} is not a JSON value: {type(value).__name__}", field=path)


@final
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
        """The queues of the calls dispatched now, for :meth:`force`, which only enqueues. Added
        just before a call's drive starts and removed in ``execute``'s ``finally``; a force that
        races the removal is harmless, since each queue belongs to one lease and dies with it."""

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
            if tool.kind != "supervisor":  # a supervisor tool's arguments never cross the wire
                _check_wire_arguments(arguments)
        except ArgumentError as e:
            return _invalid(request.call_id, tool, str(e))
        except RecursionError:
            # json.loads gives up on nesting deeper than Python's stack: a bad call, not a bug.
            return _invalid(request.call_id, tool, "arguments nest too deeply")
        return tool, arguments

    def timeout_for(self, tool: Tool, arguments: Mapping[str, Any]) -> float | None:
        """The call's own timeout in seconds (None: none); see :meth:`timeout_choice`."""
        return self.timeout_choice(tool, arguments).seconds

    def timeout_choice(self, tool: Tool, arguments: Mapping[str, Any]) -> TimeoutChoice:
        """The call's own timeout, and whether the model's argument was clamped to get it.

        Precedence (docs/workers.md, Tools), first that applies:

        1. the model's ``timeout`` argument (shell tools; a positive number), clamped to the cap;
        2. the agent's default, ``default_timeout`` (``--tool-timeout``): it is the default of
           **every** tool, ``bash`` and a tool declared with its own ``timeout`` included — the
           person running the job knows how long its builds take, the tool's author did not;
        3. the tool's own default (``bash``: 120 s);
        4. none: the call runs until it ends or its turn is cancelled.

        The cap is the largest of the tool's own cap (``bash``: 600 s), ``max_timeout``
        (``max_tool_timeout``) and ``default_timeout``: an agent-wide setting only ever raises a
        tool's cap, so ``--tool-timeout 900`` is never cut back to 600 s. A tool with no cap of its
        own under an agent with no ``max_timeout`` has none. A default above the cap (a tool
        declared that way) is clamped too, silently: the model did not ask for it.
        """
        limits = [c for c in (tool.max_timeout, self.max_timeout) if c is not None]
        cap = max(limits) if limits else None
        if cap is not None and self.default_timeout is not None:
            cap = max(cap, self.default_timeout)
        requested = arguments.get("timeout") if tool.kind == "shell" else None
        # bool is an int to Python, not a number to JSON (the schema rejects it first anyway);
        # NaN, zero and negatives are no timeout anyone meant: the default applies.
        if isinstance(requested, int | float) and not isinstance(requested, bool) and requested > 0:
            asked = float(requested)
            if cap is not None and asked > cap:
                return TimeoutChoice(cap, asked=asked, cap=cap)
            return TimeoutChoice(asked)
        if self.default_timeout is not None:
            value: float | None = self.default_timeout
        else:
            value = tool.timeout
        if value is not None and cap is not None:
            value = min(value, cap)
        return TimeoutChoice(value)

    def force(self) -> None:
        """Skip the rest of the grace period of every call being stopped: kill now.

        A call still ``Running`` ignores it: a force means "the stop under way, faster". The
        agent aborts the turn's signal before it forces, and the abort's callback enqueues
        ``_ABORT`` synchronously, so every call of that turn sees the abort, then the force.
        """
        for queue in list(self._inflight):
            queue.put_nowait(_FORCE)

    def _ready(self, request: ToolCallRequest) -> _Ready | ToolOutcome:
        """Everything up to the wire: the tool, its arguments, and the run message encoded.
        Encoding before a worker is taken means a message that cannot be sent never holds one."""
        prepared = self.prepare(request)
        if isinstance(prepared, ToolOutcome):
            return prepared
        tool, arguments = prepared
        choice = self.timeout_choice(tool, arguments)
        timeout = choice.seconds
        grace = request.grace or tool.grace or self.grace
        run = Run(
            call_id=request.call_id,
            tool=tool.name,
            tag=call_tag(request.owner or self.identity, request.call_id),
            arguments=arguments,
            cwd=show_name(request.cwd),  # the wire takes text: the worker maps it back
            timeout=timeout,
            grace=grace,
            output_head_bytes=self.head_bytes,
            output_tail_bytes=self.tail_bytes,
            # A value from this process's environment (a path, a passed variable) may hold any
            # bytes and the wire takes text: spelled as a file name, the worker maps it back, so
            # the tool gets the bytes themselves.
            env_add={
                show_name(k): show_name(v)
                for k, v in {**self.env_add, "ANDON_CALL_ID": request.call_id}.items()
            },
            env_remove=self.env_remove,
        )
        try:
            frames = encode(run, max_bytes=self.pool.config.max_message_bytes)
        except MessageTooLarge as e:
            return _invalid(
                request.call_id,
                tool,
                f"the call is {e.size} bytes on the wire, over the limit of {e.limit} bytes "
                "(send less at a time)",
            )
        except (TypeError, ValueError) as e:
            # The arguments passed _check_wire_arguments: what the wire refuses is andon's own
            # part of the message (a working folder or a session path that is not UTF-8, say).
            return _internal_not_run(request.call_id, f"encoding the run message failed: {e}")
        return _Ready(tool, arguments, run, tuple(frames), choice.note(tool.name))

    # -- one call ----------------------------------------------------------------------------

    async def execute(
        self,
        request: ToolCallRequest,
        signal: AbortSignal,
        observer: ExecutionObserver | None = None,
    ) -> ToolOutcome:
        """Run one call to its end and return its outcome.

        Never raises for the call's fate, nor for a failure inside the executor: that answers
        the call ``INTERNAL`` once the call is stopped and its worker released or retired. Only
        this task's own cancellation propagates; the call is then killed with its worker, at once.
        """
        try:
            ready = self._ready(request)
        except Exception as e:
            return _internal_not_run(
                request.call_id, f"preparing the call failed: {describe_error(e)}"
            )
        if isinstance(ready, ToolOutcome):
            return ready
        if signal.aborted:
            return aborted_before_dispatch(request.call_id)
        # Nothing has been sent yet: an abort from here to the end of ``acquire`` leaves the call
        # not started (``acquire`` checks the signal in the same step as it grants a worker, and
        # raises ``Aborted``). From its return to ``drive``'s callback nothing awaits, so no
        # abort falls between them unseen.
        try:
            lease = await self.pool.acquire(signal)
        except Aborted:
            return aborted_before_dispatch(request.call_id)
        except WorkerError as e:  # the pool is closed (or failed): no worker will ever come
            return not_run(
                request.call_id,
                ErrorCode.WORKER_LOST,
                "WorkerLost",
                f"no worker to run the call: {e}",
            )
        except Exception as e:
            return _internal_not_run(
                request.call_id, f"getting a worker failed: {describe_error(e)}"
            )
        try:
            call = _RunningCall(
                self, request, ready, lease, signal, observer or ExecutionObserver()
            )
        except Exception as e:
            lease.release()  # nothing was sent
            return _internal_not_run(
                request.call_id, f"setting up the call failed: {describe_error(e)}"
            )
        self._inflight.add(lease.messages)
        try:
            return _noted(await call.drive(), ready.timeout_note)
        except BaseException:
            # drive() answers every failure, so this is the task's own cancellation (or an
            # exit): nothing will follow the call any more, so it ends now, with its worker
            # (synchronously: cleanup after a cancel is bounded).
            if not call.result_received:
                call.retire("the task running its call was cancelled")
            raise
        finally:
            self._inflight.discard(lease.messages)
            call.settle()


def _noted(outcome: ToolOutcome, note: str) -> ToolOutcome:
    """``outcome`` with the clamp note as the last line of its content, when the call ran (a
    call that never started ran with no timeout at all; its result says why it did not run)."""
    if not note or outcome.ended_by == "not-run":
        return outcome
    content = outcome.content
    return replace(outcome, content=f"{content}\n{note}" if content else note)


@dataclass(frozen=True)
class _Ready:
    """A call validated and encoded, waiting for a worker."""

    tool: Tool
    arguments: dict[str, Any]
    run: Run
    frames: tuple[bytes, ...]
    timeout_note: str = ""  # the model's timeout argument was clamped: its result says so


class _RunningCall:
    """One dispatched call: its events, its timeline, and its outcome."""

    def __init__(
        self,
        executor: ToolExecutor,
        request: ToolCallRequest,
        ready: _Ready,
        lease: WorkerLease,
        signal: AbortSignal,
        observer: ExecutionObserver,
    ) -> None:
        self.request = request
        self.tool = ready.tool
        self.arguments = ready.arguments
        self.ready = ready
        self.lease = lease
        self.signal = signal
        self.observer = observer
        self.grace = ready.run.grace
        self.timeout = ready.run.timeout
        self.ladder = GraceLadder(
            self.grace, python=self.python, kill_ack_timeout=executor.kill_ack_timeout
        )
        """The ladder this call is stopped by: its grace policy, whether its first stage is the
        interrupt, and how long an unanswered KILL is waited for."""
        self.queue: asyncio.Queue[object] = lease.messages
        """Everything that happens to the call, in order: the worker's messages and the pool's
        ``WorkerGone`` (put by the pool), and ``_ABORT``, ``_FORCE``, ``_TICK`` (put by the
        signal's callback, :meth:`ToolExecutor.force` and the timer). The lease's own queue, so
        nothing left in it can reach another call."""
        self.clock = executor.clock
        self.t0 = 0.0
        """When the run was sent, on the executor's clock; set once, just before the send. The
        result's ``duration`` and the call's own timeout count from here."""
        self.timeline: Timeline = Running(0.0, self.timeout)
        """Where the call is on the grace ladder; only :meth:`_apply` replaces it after the
        dispatch, with what :meth:`GraceLadder.step` returns, so only forward."""
        self.dispatched = False
        """True from just before the run's send on (never reset): the worker may have the call,
        so it can be released only once its result came. False: nothing was sent."""
        self.result_received = False
        """The worker's ``result`` for the call arrived (never reset): the worker then reported
        the call's processes gone and is idle, so it may go back to the pool."""
        self.retired = False
        """The worker was killed on purpose (set once, by :meth:`retire`); it is never released."""
        self.failure: str | None = None
        """The first failure inside the executor, if any (never replaced): the answer is then
        ``INTERNAL`` naming it, unless the turn's cancel stopped the call and its result came."""
        self.started: Started | None = None
        """The worker's ``started`` report (the tool's process exists), once it came."""
        self.last_result: Result | None = None
        """The ``result`` received, kept for an answer built after a failure handling it."""
        self.acked = 0
        """Output bytes consumed, as the worker was last told (``ack``); only grows. The worker
        sends at most ``OUTPUT_WINDOW`` bytes beyond it, then stops reading the tool's pipe."""
        self.spill = Spill(
            executor.session_dir,
            request.call_id,
            executor.head_bytes + executor.tail_bytes,
            executor.spill_cap,
        )
        self._timer: Timer | None = None
        """The one armed timer, for the timeline's next deadline; ``None`` when none is due (no
        timeout, or ``term_after=inf``). Replaced, never added to, by :meth:`_arm`."""

    @property
    def python(self) -> bool:
        return self.tool.kind == "python"

    @property
    def stopping(self) -> Stopping | None:
        """The stop under way (or the one under way when the worker was lost); a state, read
        only (the transitions are :meth:`GraceLadder.step`'s)."""
        timeline = self.timeline
        if isinstance(timeline, Lost):
            return timeline.stop
        return timeline if isinstance(timeline, Stopping) else None

    async def drive(self) -> ToolOutcome:
        # The callback only enqueues: the loop below is the timeline's one writer. Added before
        # the first await, so no abort can fall between the lease and the loop unseen (on a
        # signal already aborted it would fire at once, putting the stop first in the queue).
        handle = self.signal.add_callback(lambda _cause: self.queue.put_nowait(_ABORT))
        try:
            # The tag before the send: from the moment the worker may have the run, a lost worker
            # must be cleaned up by the tag (and the cgroup named after it).
            self.lease.tag = self.ready.run.tag
            self.t0 = self.clock.monotonic()
            self.timeline = Running(self.t0, self.timeout)
            # Before the await, not after: if the send is cancelled or fails half-way, the worker
            # may still have the run, and ``settle`` must retire it rather than lend it again.
            self.dispatched = True  # from the send on, the call counts as started
            await self._send_frames(list(self.ready.frames))
            # An abort during the send is handled right after it: the ``interrupt`` follows the
            # run, and a worker that has not spawned the tool yet keeps that cancel and answers
            # ``ABORTED_BEFORE_DISPATCH`` (docs/workers.md, A cancel is never lost). The first
            # step arms the timer for the call's own timeout (or, if the send failed, for the
            # wait for the written-off worker's exit).
            outcome = await self._apply(Tick())
            if outcome is not None:
                return self._final(outcome)
            while True:
                # The only wait for the world. A task cancellation here (or at any send) leaves
                # through ``finally`` below and ``execute``, which kills the worker with the call.
                item = await self.queue.get()
                try:
                    outcome = await self._handle(item)
                except Exception as e:
                    failure = (
                        str(e)
                        if isinstance(e, _Failure)
                        else (f"handling {_item_name(item)} failed: {describe_error(e)}")
                    )
                    # The call is not abandoned: it is stopped by the ladder a cancel takes, and
                    # the loop goes on draining it; only the answer becomes INTERNAL.
                    await self._fail(failure)
                    if self.result_received:
                        # The result came, but could not be made into an outcome: the call is
                        # over (its worker swept it before reporting), so answer now.
                        return self._internal(None)
                    continue
                if outcome is not None:
                    return self._final(outcome)
        finally:
            # Synchronous, so it runs whole even on a cancellation: no callback or timer of this
            # call outlives it (an abort after this point enqueues nothing).
            handle.remove()
            self._cancel_timer()
            self.spill.close()

    def settle(self) -> None:
        """The call is over for the executor: its worker goes back to the pool if it is known to
        be idle (its result came through, or nothing was sent), else it is retired.

        A worker that may still run the call is never lent again: the next call would share it
        with the leftovers of this one, and the worker's one-call-at-a-time rule would break."""
        if not self.lease.alive or self.retired:
            return
        if self.result_received or not self.dispatched:
            self.lease.release()
        else:
            self.retire("retired: its call ended without a result")

    def retire(self, reason: str) -> None:
        """Kill the worker and whatever its call started; its exit starts a replacement."""
        if self.retired or not self.lease.alive:
            return
        self.retired = True
        try:
            self.lease.kill(reason)
        except Exception:
            _log.exception("call %s: could not kill its worker", self.request.call_id)

    # -- events ------------------------------------------------------------------------------

    async def _handle(self, item: object) -> ToolOutcome | None:
        match item:
            case Started() | Output() | Signalled() | Result() | ErrorReply() if isinstance(
                self.timeline, Lost
            ):
                # The worker was written off (an error reply, a send that failed, no answer to
                # SIGKILL): nothing more it says is believed, not even what the pool queued
                # before it began to drop the worker's frames (docs/workers.md, The grace
                # policy). Its exit, or the ``Lost`` deadline, answers the call: WORKER_LOST.
                _log.warning(
                    "call %s: a %r from a worker already written off is not believed",
                    self.request.call_id,
                    item.type,
                )
            case Started():
                self.started = item
                self._observe("on_started", item, self.lease.worker_id)
            case Output():
                # The worker's window first: a failure below must not stall its output.
                consumed = item.offset + len(item.data)
                if consumed - self.acked >= OUTPUT_WINDOW // 4:  # a quarter at a time
                    self.acked = consumed
                    await self._send(Ack(call_id=self.request.call_id, offset=self.acked))
                try:
                    self.spill.add(item.data)
                except Exception as e:
                    raise _Failure("keeping the output (the spill)", e) from e
                self._observe("on_output", item.call_id, item.data)
            case Signalled():
                self._observe("on_signal", item.call_id, item.stage, item.at, item.targets)
            case Result():
                # The call is over: the worker sends its result only after its sweep left none of
                # the call's processes it can reach. An ``_ABORT`` still queued behind it is never
                # read (the call ended on its own first, and keeps its own result).
                self.result_received = True
                self.last_result = item
                return self._from_result(item)
            case ErrorReply():
                # The worker refused or failed to read our message: broken means dead.
                await self._apply(WriteOff(f"the worker answered an error: {item.reason}"))
            case WorkerGone():
                return self._from_worker_gone(item)
            case _Abort():
                # What a cancel does in each state is the ladder's to say: from Running the stop
                # begins; a stop after an internal failure becomes the turn's; otherwise nothing.
                return await self._apply(BeginStop("abort", self.signal.reason))
            case _Force():
                return await self._apply(Force())
            case _Tick():
                return await self._apply(Tick())
        return None

    def _observe(self, name: str, *args: Any) -> None:
        # An observer that raises is andon's failure (the agent's observer writes the log): the
        # call cannot be followed honestly any more, so it is stopped and answered INTERNAL.
        try:
            getattr(self.observer, name)(*args)
        except Exception as e:
            raise _Failure(f"the observer's {name}", e) from e

    async def _fail(self, failure: str) -> None:
        """A failure inside the executor: remember the first, and stop the call it can no
        longer follow by the ladder a cancel takes (the worker is fine; andon is not)."""
        if self.failure is None:
            self.failure = failure
            _log.error("call %s: %s", self.request.call_id, failure)
        if not self.result_received:
            try:
                # Only a running call begins a stop (the ladder's rule): a second reason to stop
                # never restarts it, so ``began`` and the stages sent stay those of the first.
                await self._apply(BeginStop("internal", _INTERNAL_CAUSE))
            except Exception as e:
                await self._apply(
                    WriteOff(f"andon could not stop the call after an internal error: {e!r}")
                )

    async def _apply(self, event: LadderEvent) -> ToolOutcome | None:
        """Step the ladder with ``event`` and do what it says, in order.

        The one place after the dispatch where the timeline changes, a stage is sent, the timer
        is armed and the worker is given up on. A step decides; this only acts, so nothing here
        chooses a stage. What goes wrong while acting is one more event for the ladder: a send
        or a timer that fails gives up on the worker (``WriteOff``), stepped after the actions in
        hand are dropped (they were decided for a worker that was still trusted). A stage is in
        the timeline before its send, so nothing handled later sends it again, and the ``Lost``
        that follows a failed send still reports it. Returns the call's answer when the step
        says to answer (``AnswerLost``)."""
        events: list[LadderEvent] = [event]
        while events:
            self.timeline, actions = self.ladder.step(
                self.timeline, events.pop(0), self.clock.monotonic()
            )
            for action in actions:
                match action:
                    case SendStage():
                        lost = await self._send_stage(action)
                        if lost is not None:
                            events.append(WriteOff(lost))
                            break
                    case ArmTimer(at=at):
                        if not self._arm(at):
                            # Without its timer the timeline cannot be kept: the call cannot
                            # wait for stages that would never come, so it ends with its worker
                            # (whose exit answers it).
                            events.append(WriteOff("andon could not keep the call's timeline"))
                    case RetireWorker(reason=reason):
                        # Kill it with the call's processes, and wait for its exit. From here no
                        # stage is sent: the worker is not trusted to apply one. The call is
                        # answered by the pool's ``WorkerGone`` for that exit or, if none comes
                        # within ``kill_ack_timeout``, by the ``Lost`` deadline (``AnswerLost``),
                        # so an unkillable worker cannot hang the turn.
                        self.retire(reason)
                    case AnswerLost(reason=reason):
                        # The killed worker never showed its exit (it could not be signalled?):
                        # answer the call anyway; the worker was retired and is the pool's.
                        return self._from_worker_gone(WorkerGone(reason, on_purpose=True))
        return None

    async def _send_stage(self, send: SendStage) -> str | None:
        """Send one stage the ladder decided; the reason to give up on the worker if the send
        failed. ``kill_in`` tells the worker how far off KILL is, so its own sweep never waits
        past it."""
        try:
            await self.lease.send(
                Cancel(
                    call_id=self.request.call_id,
                    stage=send.stage,
                    cause=send.cause.to_dict() if send.cause is not None else None,
                    kill_in=send.kill_in,
                )
            )
        except Exception as e:
            return self._cannot_send("cancel", e)
        return None

    async def _send(self, msg: Message) -> None:
        try:
            await self.lease.send(msg)
        except Exception as e:
            await self._apply(WriteOff(self._cannot_send(msg.type, e)))

    async def _send_frames(self, frames: list[bytes]) -> None:
        try:
            await self.lease.send_frames(frames)
        except Exception as e:
            await self._apply(WriteOff(self._cannot_send("run", e)))

    def _cannot_send(self, what: str, error: Exception) -> str:
        """Record a send that failed; the reason to give up on the worker. It can no longer be
        told what to do, so it cannot be trusted with the call: it goes, with the call's
        processes (the pool finds them by the call's tag)."""
        if self.failure is None:
            self.failure = f"sending the {what!r} message failed: {describe_error(error)}"
            _log.error("call %s: %s", self.request.call_id, self.failure)
        return f"andon could not send it a {what!r} message"

    def _arm(self, at: float | None) -> bool:
        """Arm the one timer for ``at`` (none for ``None``); False if it could not be armed.

        The old timer is cancelled first, synchronously, so at most one is armed; one that
        already fired has left a ``_TICK`` in the queue, which finds nothing due, or what is due
        now, and does it.
        """
        self._cancel_timer()
        if at is None:
            return True
        try:
            self._timer = self.clock.call_at(at, self._tick)
        except Exception as e:
            if self.failure is None:
                self.failure = f"arming the grace timer failed: {describe_error(e)}"
            return False
        return True

    def _tick(self) -> None:
        self.queue.put_nowait(_TICK)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- outcomes ----------------------------------------------------------------------------

    def _final(self, outcome: ToolOutcome) -> ToolOutcome:
        """The answer: the outcome itself, unless andon failed along the way. A cancel still
        wins: a call that the turn's abort stopped keeps its real drained result."""
        if self.failure is None or (self.signal.aborted and self.result_received):
            return outcome
        return self._internal(outcome)

    def _internal(self, drained: ToolOutcome | None) -> ToolOutcome:
        """``INTERNAL``, after a failure inside the executor: the error first, then whatever the
        call's drained result (or its lost worker) says."""
        message = f"internal error in andon's executor: {self.failure}"
        if isinstance(self.timeline, Lost):
            message += "; andon killed its worker and the call's processes"
        elif self.stopping is not None:
            message += "; andon stopped the call"
        base = drained if drained is not None else self._bare_outcome()
        content = f"Error: {message}" + (f"\n{base.content}" if base.content else "")
        return replace(
            base,
            content=content,
            is_error=True,
            error=ErrorInfo(name="InternalError", code=ErrorCode.INTERNAL, message=message),
        )

    def _bare_outcome(self) -> ToolOutcome:
        """What is known of a call whose result could not be turned into an outcome."""
        result = self.last_result
        ran = result is not None and not self.python and result.ended_by != "not-run"
        return ToolOutcome(
            call_id=self.request.call_id,
            content="",
            is_error=True,
            ended_by=result.ended_by if result is not None else "worker-lost",
            duration=self.clock.monotonic() - self.t0,
            exit_code=result.exit_code if ran and result is not None else None,
            exit_signal=result.exit_signal if ran and result is not None else None,
            ran=ran,
            output_bytes=self.spill.total,
            output_file=self.spill.relpath,
            started=self.started,
        )

    def _ended_by(self, stage: str) -> Any:
        stop = self.stopping
        if stop is not None and stop.why == "timeout" and stage in CANCEL_STAGES:
            return f"timeout-{stage}"
        return stage

    def _stop_error(self) -> ErrorInfo | None:
        stop = self.stopping
        if stop is None:
            return None
        if stop.why == "abort":
            return ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message="tool call aborted")
        if stop.why == "internal":  # replaced by the failure's own error (_internal)
            return ErrorInfo(
                name="InternalError", code=ErrorCode.INTERNAL, message="internal error in andon"
            )
        return ErrorInfo(
            name="ToolTimeout",
            code=ErrorCode.TOOL_TIMEOUT,
            message=f"tool call timed out after {self.timeout:g}s",
        )

    def _status(self, exit_code: int | None, exit_signal: int | None) -> str:
        stop = self.stopping
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
        closed = self.lease.pool_stopping
        if closed is not None and self.stopping is None and result.ended_by != "exit":
            # The pool's close stopped the call (its worker SIGKILLs the call on ``shutdown``):
            # say so, rather than report a SIGKILL nobody here asked for.
            return self._from_worker_gone(WorkerGone(closed, on_purpose=True))
        if (
            result.ended_by == "not-run"
            and result.error is not None
            and result.error.code is ErrorCode.ABORTED_BEFORE_DISPATCH
        ):
            # The cancel reached the worker before the spawn: the tool never started.
            return aborted_before_dispatch(self.request.call_id)
        # A call that ended on its own before the stop reached it keeps its own result.
        stopped = self.stopping is not None and result.ended_by != "exit"
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
        stop = self.stopping
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
        message = f"worker lost: {reason}; {gone.call_note}"
        stop = self.stopping
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


def _item_name(item: object) -> str:
    kind = getattr(item, "type", None)
    return f"a worker's {kind!r} message" if isinstance(kind, str) else type(item).__name__
