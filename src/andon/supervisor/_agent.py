"""The Agent: phases, the durable inbox, cancel, the wake latch, and live events.

Phases::

    idle        {last_turn}
    maintenance {controller, last_turn, wake_requested}
    running     {controller, turn, step, wake_requested}

Every non-idle phase owns exactly one controller; each turn gets a fresh one, installed before
``turn/start``, so a timer or hook holding an old turn's signal can never cancel a later turn.

**The wake latch.** ``cancel(keep_inbox=True)`` returns at once while the driver is still
unwinding. A waking send in that window sets ``wake_requested``; the driver, in its ``finally``,
after the phase is back to idle, replays the wake synchronously if the inbox still has work. So
``turn/end N`` always precedes the replayed ``turn/start N+1``, and ``when_idle()`` (which waits
for idle *and* no pending replay) never returns in the gap. Do not "fix" this by setting the phase
to idle inside ``cancel()``: two drivers would overlap. The latch also covers the window after a
turn's ``turn/end`` is written and before the driver has made it durable and decided what runs
next: a waking send there (a ``steer`` included) is replayed, never stranded.

**Tasks.** The agent starts exactly one kind of task, its driver, and only in the ``TaskGroup``
it was given (``open_agent``'s, or a subagent tool's), so every driver is awaited before that
block ends. The turn budget is a clock timer (``Clock.call_at``), not a task.

The turn driver sees the agent only through the :class:`~andon.supervisor._host.TurnHost` built
for each turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, final

from andon.base import (
    AbortController,
    AbortSignal,
    AgentClosed,
    Cause,
    Clock,
    ConfigError,
    Disposed,
    Hook,
    LogWriteFailed,
    MessageSource,
    SystemClock,
    Timer,
    clean_text,
    message_id,
)
from andon.llm import Model, TokenEstimator
from andon.session import (
    AgentError,
    AgentEvent,
    AgentStatus,
    Completed,
    LiveEvent,
    MaxTokens,
    Record,
    SessionLog,
    SessionStart,
    Status,
    TurnStart,
    UserMessage,
)
from andon.supervisor._context import ContextKeeper
from andon.supervisor._executor import ToolExecutor
from andon.supervisor._hooks import HookSpec, OnRequestError, TurnBudget
from andon.supervisor._host import LogPort, TurnHost
from andon.supervisor._inbox import Inbox, Target
from andon.supervisor._turn import run_turn
from andon.workers import ToolRegistry

__all__ = ["Agent", "Status", "check_max_parallel"]

_log = logging.getLogger("andon.agent")

_BASE_USAGE = ("prompt_tokens", "completion_tokens")
# Summed only once some reply reported them: a provider that never does shows none of them.
_EXTRA_USAGE = ("cached_prompt_tokens", "uncached_prompt_tokens", "reasoning_tokens")


@dataclass
class _Idle:
    last_turn: int


@dataclass
class _Maintenance:
    controller: AbortController
    last_turn: int
    wake_requested: bool = False


@dataclass
class _Running:
    controller: AbortController
    turn: int
    step: int = 0
    wake_requested: bool = False
    ended: bool = False  # turn/end is written; the driver is deciding what runs next


_Phase = _Idle | _Maintenance | _Running


@dataclass
class _Subscriber:
    queue: asyncio.Queue[AgentEvent | None] = field(default_factory=asyncio.Queue)


def check_max_parallel(value: object) -> int:
    """``max_parallel`` as given, if it is a whole number of at least 1; else a clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"max_parallel must be a whole number of at least 1 (the most tool calls one step "
            f"runs at once), got {value!r}"
        )
    return value


def check_context_window(value: object) -> int | None:
    """``context_window`` as given, if it is ``None`` or a whole number of tokens of at least 1;
    else a clear error."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(
            f"context_window must be a whole number of tokens of at least 1, or None (unknown), "
            f"got {value!r}"
        )
    return value


@final
class Agent:
    """An agent loop over one session. Create it with :func:`andon.open_agent`.

    ``tasks`` is the task group the agent's driver runs in; its owner awaits it (``open_agent``
    does, after disposing the agent).
    """

    def __init__(
        self,
        *,
        log: SessionLog,
        model: Model,
        executor: ToolExecutor,
        registry: ToolRegistry,
        records: Sequence[Record],
        system_prompt: str,
        cwd: str,
        tasks: asyncio.TaskGroup,
        hooks: Sequence[HookSpec] = (),
        max_parallel: int = 4,
        clock: Clock | None = None,
        next_turn: Sequence[UserMessage] = (),
        next_step: Sequence[UserMessage] = (),
        context_window: int | None = None,
        from_cut: bool = False,
    ) -> None:
        check_context_window(context_window)
        if sum(isinstance(h, OnRequestError) for h in hooks) > 1:
            raise ConfigError(
                "at most one OnRequestError hook: it replaces the model adapter's retry decision, "
                "and two would contradict each other"
            )
        self._tasks = tasks
        self._logfile = log
        self._model = model
        self._model_name = model.info.name
        self._executor = executor
        self._registry = registry
        self._system_prompt = system_prompt
        self._cwd = cwd
        self._hooks = tuple(hooks)
        self._budgets = tuple(h for h in hooks if isinstance(h, TurnBudget))
        self._budget_timer: Timer | None = None
        self._max_parallel = check_max_parallel(max_parallel)
        self._clock = clock or SystemClock()
        # The model-visible part of the log (chunks excluded), for building requests.
        self._records: list[Record] = [r for r in records if r.type != "assistant/chunk"]
        # The session id owns this agent's tool calls: it is half of every call's process tag, so
        # crash repair can find the call's processes from the log alone. A subagent shares its
        # parent's executor but has its own session id, so equal call ids never collide.
        self._owner: str | None = next(
            (r.data.session_id for r in self._records if isinstance(r.data, SessionStart)), None
        )
        self._inbox = Inbox(self._write, next_turn, next_step)
        self._phase: _Phase = _Idle(log.last_turn)
        self._status: Status = "idle"
        self._changed = asyncio.Event()
        self._closing = False
        self._failure: LogWriteFailed | None = None
        self._subscribers: list[_Subscriber] = []
        # The session's running token totals: the two base counts always, each optional count
        # (``_EXTRA_USAGE``) from the first reply that reported it on.
        self.usage: dict[str, int] = dict.fromkeys(_BASE_USAGE, 0)
        self._context = ContextKeeper(
            window=context_window,
            estimator=TokenEstimator(),
            model=model,
            records=lambda: self._records,
            system=lambda: self._system_prompt,
            write=self._write,
            on_usage=self._add_usage,
            from_cut=from_cut,
        )
        self.turns_run = 0
        self.tool_calls = 0

    # -- public API --------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        """``"running"`` only while a turn runs; idle and maintenance both read ``"idle"``."""
        return "running" if isinstance(self._phase, _Running) else "idle"

    @property
    def session_dir(self) -> str:
        return str(self._logfile.path.parent)

    @property
    def session_id(self) -> str | None:
        """The session's id (``session/start``); with a call id it makes the call's process tag
        (:func:`andon.base.call_tag`)."""
        return self._owner

    def records_from(self, seq: int) -> Iterator[Record]:
        """The session's records from ``seq`` on, read from its log file as they stand. For a
        resumed session the records before the resume are not parsed again to reach them
        (``SessionLog.records_from``): what a run says at its end costs the run, not the log."""
        return self._logfile.records_from(seq)

    def followup(self, text: str, *, source: MessageSource = "user") -> str:
        """Queue ``text`` as its own later turn, and wake the agent. ``source`` says who wrote
        it, for the log (``"output-schema"``: andon's own request for a matching answer)."""
        return self._send(text, "next-turn", wakes=True, source=source)

    def steer(self, text: str) -> str:
        """Queue ``text`` for the next step of the running turn, and wake the agent."""
        return self._send(text, "next-step", wakes=True, source="steer")

    def inject(self, text: str) -> str:
        """Queue ``text`` for the next step; never wakes the agent."""
        return self._send(text, "next-step", wakes=False, source="inject")

    def wake(self) -> bool:
        """Start a turn for work already queued (e.g. parked work of a resumed session).

        Returns whether a turn started: only an idle agent with a non-empty inbox starts one.
        """
        if self._closing:
            raise AgentClosed()
        if self._failure is not None:
            raise self._failure
        if not isinstance(self._phase, _Idle) or not self._inbox.has_work:
            return False
        self._start_driver()
        return True

    def cancel(self, cause: Cause, *, keep_inbox: bool = False, force: bool = False) -> None:
        """Cancel the running turn (synchronous; never awaits). The first cause wins.

        Without ``keep_inbox`` the inbox is cleared durably (and the wake latch dropped), also
        while idle. ``force`` also skips the rest of the grace period of in-flight tool calls.
        """
        if not keep_inbox:
            if self._failure is None:
                self._inbox.clear()
            if not isinstance(self._phase, _Idle):
                self._phase.wake_requested = False
        if isinstance(self._phase, _Idle):
            return  # an idle cancel arms nothing for future work
        self._phase.controller.abort(cause)
        if force and isinstance(self._phase, _Running):
            self._executor.force()

    async def when_idle(self) -> None:
        """Return once the agent is idle with no replay pending; raise a log write failure."""
        while not isinstance(self._phase, _Idle):
            await self._wait_changed()
        if self._failure is not None:
            raise self._failure

    def events(self, since_seq: int | None = None) -> AsyncIterator[AgentEvent]:
        """Every log record as written (a :class:`~andon.session.Record`), and the live events
        that are never logged (:data:`~andon.session.LiveEvent`): docs/agent-loop.md, Events.

        The subscription starts when this is called (not at the first ``__anext__``), or at
        ``since_seq`` (older records are read from the log file first). One unbounded queue per
        subscriber; the iterator ends when the agent is closed.
        """
        sub = _Subscriber()
        self._subscribers.append(sub)
        return self._stream(sub, since_seq)

    async def _stream(self, sub: _Subscriber, since_seq: int | None) -> AsyncIterator[AgentEvent]:
        try:
            last = -1
            if since_seq is not None:
                for record in self._logfile.records_from(since_seq):
                    last = record.seq
                    yield record
            while True:
                item = await sub.queue.get()
                if item is None:
                    return
                if isinstance(item, Record) and item.seq <= last:
                    continue  # replayed from the file already
                yield item
        finally:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    async def compact(self, *, force: bool = False) -> bool:
        """Compact the history now, between turns, as a maintenance job (docs/agent-loop.md,
        Compaction): if the next request would be over the window's budget, or with ``force``
        whatever the estimate says (a session whose last turn overflowed). Its records carry no
        turn. Returns whether anything changed; raises like :meth:`run_maintenance`, and a
        model failure of the summary call as :class:`~andon.base.ModelError` (nothing is then
        written). ``cancel()`` aborts it (:class:`~andon.base.Aborted`, nothing written)."""
        changed = False
        tools = tuple(self._registry.openai_schemas())

        async def job(signal: AbortSignal) -> None:
            nonlocal changed
            changed = await self._context.fit(signal, tools, force=force)

        await self.run_maintenance(job)
        return changed

    @property
    def context_window(self) -> int | None:
        """The model's context window in tokens as the agent knows it (``None``: unknown); a
        server's refusal can teach it."""
        return self._context.window

    async def run_maintenance(self, job: Callable[[AbortSignal], Awaitable[None]]) -> None:
        """Run a non-turn job (e.g. compaction) while idle; it writes nothing to the log.

        Raises ``RuntimeError`` unless idle. Status stays ``"idle"``; waking sends during the job
        are latched and replayed when it ends; ``when_idle()`` waits for it; ``cancel()`` aborts
        the job's signal.
        """
        if self._closing:
            raise AgentClosed()
        phase = self._phase
        if not isinstance(phase, _Idle):
            raise RuntimeError("run_maintenance needs an idle agent (a turn or job is running)")
        controller = AbortController()
        self._phase = _Maintenance(controller, phase.last_turn)
        self._set_status()
        try:
            await job(controller.signal)
        finally:
            current = self._phase
            assert isinstance(current, _Maintenance)
            self._phase = _Idle(current.last_turn)
            if current.wake_requested and self._inbox.has_work and not self._closing:
                self._start_driver()
            self._set_status()

    # -- sends and waking --------------------------------------------------------------------

    def _send(self, text: str, target: Target, *, wakes: bool, source: MessageSource) -> str:
        if self._closing:
            raise AgentClosed()
        if self._failure is not None:
            raise self._failure
        if not isinstance(text, str):
            raise TypeError("a message is a string")
        # Outside text (a prompt from argv, a pasted log): valid Unicode before the log sees it.
        message = UserMessage(message_id(), clean_text(text), source)
        phase = self._phase
        waking_after_abort = (
            wakes and not isinstance(phase, _Idle) and phase.controller.signal.aborted
        )
        if waking_after_abort:
            target = "next-turn"  # a steer after a cancel becomes a follow-up
        self._inbox.insert(target, message)
        if wakes:
            self._wake(latch=waking_after_abort)
        return message.id

    def _wake(self, *, latch: bool) -> None:
        phase = self._phase
        if isinstance(phase, _Idle):
            self._start_driver()
        elif latch or isinstance(phase, _Maintenance) or phase.ended:
            # After an abort, during maintenance, or after turn/end: no step boundary of a
            # running turn will see this send, so the driver replays it when it is done.
            reason = phase.controller.signal.reason
            if not isinstance(reason, Disposed):  # a disposed agent never replays
                phase.wake_requested = True
        # running and not aborted: the driver sees the inbox at its next boundary

    def _start_driver(self) -> None:
        """Switch to running synchronously: when this returns, turn/start and the claim are
        already in the log (ordering is then deterministic and testable)."""
        assert isinstance(self._phase, _Idle)
        # Fails (RuntimeError) off the loop's thread before anything is written or switched.
        asyncio.get_running_loop()
        started = self._begin_turn(self._phase.last_turn + 1)
        if started is None:
            return
        self._tasks.create_task(self._drive(*started))

    def _begin_turn(self, turn: int) -> tuple[TurnHost, list[UserMessage]] | None:
        controller = AbortController()  # one per turn, installed before turn/start
        self._phase = _Running(controller, turn)
        self._set_status()
        self._arm_budget(controller)
        try:
            self._write(TurnStart(turn))
            claimed = self._inbox.claim_first_step()
        except LogWriteFailed:
            self._disarm_budget()
            self._phase = _Idle(turn - 1)
            self._set_status()
            return None
        return self._host(turn, controller), claimed

    def _host(self, turn: int, controller: AbortController) -> TurnHost:
        """The port through which turn ``turn`` (and its supervisor tools) reach this agent."""
        return TurnHost(
            turn=turn,
            controller=controller,
            model=self._model,
            registry=self._registry,
            executor=self._executor,
            hooks=self._hooks,
            inbox=self._inbox,
            log=LogPort(
                write=self._write,
                write_many=self._write_many,
                barrier=self._barrier,
                publish=self._publish_live,
            ),
            clock=self._clock,
            cwd=self._cwd,
            session_dir=self._logfile.path.parent,
            owner=self._owner,
            max_parallel=self._max_parallel,
            open_child=self._open_child,
            request_messages=self._request_messages,
            context=self._context,
            on_step=self._on_step,
            on_usage=self._add_usage,
            on_error=self._report_error,
        )

    async def _drive(self, host: TurnHost, claimed: list[UserMessage]) -> None:
        """Drain turns: queued turns run only after completed or max-tokens turns."""
        turn = host.turn
        try:
            while True:
                reason = await run_turn(host, claimed)
                # turn/end is written; from here on a waking send latches (see _wake).
                phase = self._phase
                if isinstance(phase, _Running):
                    phase.ended = True
                self._disarm_budget()
                self.turns_run += 1
                try:
                    await self._barrier()  # every turn/end is durable
                except LogWriteFailed:
                    break
                if not isinstance(reason, Completed | MaxTokens) or self._closing:
                    break  # after blocked, error or aborted turns, pending work stays parked
                if not self._inbox.next_turn:
                    break  # a latched send (a steer during the barrier) is replayed below
                started = self._begin_turn(turn + 1)
                if started is None:
                    break
                host, claimed = started
                turn = host.turn
        except LogWriteFailed:
            pass  # recorded in self._failure; the agent goes idle and says so
        finally:
            self._disarm_budget()
            phase = self._phase
            replay = isinstance(phase, _Running) and phase.wake_requested
            last = phase.turn if isinstance(phase, _Running) else turn
            self._phase = _Idle(last)
            # The replay is decided here, synchronously, after the phase is back to idle.
            if replay and self._inbox.has_work and not self._closing and self._failure is None:
                self._start_driver()
            self._set_status()

    # -- what the turn driver calls ----------------------------------------------------------

    def _write(self, data: Any) -> Record:
        return self._write_many((data,))[0]

    def _write_many(self, datas: Sequence[Any]) -> list[Record]:
        """Append records as one batch (``SessionLog.append_many``); one record is a batch too."""
        try:
            written = self._logfile.append_many(datas)
        except LogWriteFailed as e:
            if self._failure is None:
                self._failure = e
                self._publish_live(AgentError("LOG_WRITE_FAILED", str(e)))
            raise
        for record in written:
            if record.type != "assistant/chunk":
                self._records.append(record)
            if record.type == "tool/call":
                self.tool_calls += 1
            self._publish(record)
        return written

    async def _barrier(self) -> None:
        try:
            await self._logfile.barrier()
        except LogWriteFailed as e:
            if self._failure is None:
                self._failure = e
            raise

    def _request_messages(self) -> list[dict[str, Any]]:
        return self._context.messages()

    def _open_child(
        self,
        *,
        log: SessionLog,
        model: Model,
        system_prompt: str,
        records: Sequence[Record],
        tasks: asyncio.TaskGroup,
    ) -> Agent:
        """A subagent: its own log, this agent's executor, tools, clock, cwd and parallelism."""
        return Agent(
            log=log,
            model=model,
            executor=self._executor,
            registry=self._registry,
            records=records,
            system_prompt=system_prompt,
            cwd=self._cwd,
            tasks=tasks,
            max_parallel=self._max_parallel,
            clock=self._clock,
        )

    def _on_step(self, step: int) -> None:
        phase = self._phase
        if isinstance(phase, _Running):
            phase.step = step
            for budget in self._budgets:
                if budget.steps is not None and step > budget.steps:
                    phase.controller.abort(
                        Hook(f"turn budget exceeded: more than {budget.steps} steps")
                    )

    # -- turn budgets --------------------------------------------------------------------------

    def _arm_budget(self, controller: AbortController) -> None:
        """Start the time budget of a turn. The timer holds *this* turn's controller only, so a
        stale timer of an earlier turn can never cancel a later one."""
        self._disarm_budget()
        seconds = [b.seconds for b in self._budgets if b.seconds is not None]
        if seconds:
            limit = min(seconds)
            self._budget_timer = self._clock.call_at(
                self._clock.monotonic() + limit,
                lambda: controller.abort(Hook(f"turn budget exceeded: {limit:g}s")),
            )

    def _disarm_budget(self) -> None:
        if self._budget_timer is not None:
            self._budget_timer.cancel()
            self._budget_timer = None

    def _add_usage(self, usage: dict[str, Any] | None) -> None:
        """Add one reply's ``assistant/message.usage`` (``Usage.to_dict()``) to the totals."""
        if not usage:
            return
        for key in (*_BASE_USAGE, *_EXTRA_USAGE):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = self.usage.get(key, 0) + value

    def _report_error(self, code: str, message: str) -> None:
        _log.error("turn failed (%s): %s", code, message)
        self._publish_live(AgentError(code, message))

    # -- status and subscribers --------------------------------------------------------------

    def _set_status(self) -> None:
        new: Status = self.status
        if new != self._status:
            self._status = new
            self._publish_live(AgentStatus(new))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _publish(self, item: AgentEvent) -> None:
        for sub in self._subscribers:
            sub.queue.put_nowait(item)

    def _publish_live(self, item: LiveEvent) -> None:
        self._publish(item)

    # -- closing -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Dispose: ``cancel(Disposed())`` (which clears the inbox durably, as any cancel without
        ``keep_inbox`` does: a resumed session never runs work its user walked away from), then
        wait until idle. Sends after this raise."""
        if self._closing:
            return
        self.cancel(Disposed())
        self._closing = True
        while not isinstance(self._phase, _Idle):
            await self._wait_changed()
        for sub in self._subscribers:
            sub.queue.put_nowait(None)
