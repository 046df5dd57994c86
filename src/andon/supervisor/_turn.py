"""The turn driver: turns, steps, the streaming step with its salvaged prefix, and tool scheduling.

This module is large on purpose: it is the one place where the ordering rules of a turn
(docs/agent-loop.md) live together, and splitting them would scatter invariants that must be read
side by side:

* ``turn/end`` is written exactly once per turn, in a ``finally``; the final inbox re-check and
  the completed ``turn/end`` happen in one synchronous section (no ``await`` in between), so a
  steer that arrives during the turn-stopping hooks runs as another step instead of being stranded.
* ``step/end`` is written in a ``finally`` too, after every tool call of the step has its result.
* A failure is classified by ``signal.aborted``, never by the exception's type.
* Every tool call gets exactly one result in its step, in model order, on every path.
* The checkpoints (``throw_if_aborted``) sit where docs/agent-loop.md (Cancel, Streaming)
  puts them; the one before handling every stream chunk is what makes an interrupt feel instant.
* Stream deltas reach subscribers one by one, as they arrive (live ``assistant/delta`` events),
  and the log coalesced (``_reply.ChunkLog``): whatever was shown is in an ``assistant/chunk``
  record before anything that ends or follows the stream is written.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from andon.base import (
    AbortController,
    AbortSignal,
    ErrorCode,
    Hook,
    LogWriteFailed,
    ModelError,
    ReplyFinish,
    SignalStage,
    any_signal,
    call_id,
    clean_text,
)
from andon.llm import (
    Chunk,
    ModelRequest,
    OnAttempt,
)
from andon.protocol import Started
from andon.session import (
    AssistantMessage,
    AssistantReply,
    Blocked,
    Completed,
    ExitStatus,
    LlmRequest,
    LlmRetry,
    MaxTokens,
    ReasoningBlock,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolErrorInfo,
    ToolOutput,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnAborted,
    TurnEnd,
    TurnEndReason,
    TurnFailed,
    UserMessage,
    UserMessageEntered,
)
from andon.supervisor._executor import ExecutionObserver, ToolCallRequest, aborted_before_dispatch
from andon.supervisor._hooks import (
    Deny,
    GiveUp,
    OnRequestError,
    PostTool,
    PreTool,
    Reject,
    Retry,
    ToolCallInfo,
    TurnStopping,
    call_pre_step,
)
from andon.supervisor._host import TurnHost
from andon.supervisor._outcome import ToolOutcome, not_run
from andon.supervisor._reply import ChunkLog, Reply
from andon.supervisor._subagent import SubagentCall

__all__ = ["run_turn"]

_HOST = socket.gethostname()


@dataclass
class _StepOutcome:
    continuation: bool = False  # tool results are owed a continuation step
    max_tokens: bool = False


@dataclass
class _Attempts:
    """A step's model requests: how many went out (``llm/request`` numbers them on, across a
    retry after compaction), whether any data streamed, and whether the step compacted after a
    refusal already (once only)."""

    count: int = 0
    streamed: bool = False
    compacted: bool = False


@dataclass
class _Call:
    call_id: str
    name: str
    arguments: str
    parallel_safe: bool
    written: bool = False  # tool/call is in the log
    dispatched: bool = False  # handed to the executor (or a supervisor tool): it has a task
    committed: bool = False  # tool/result is in the log (exactly once, on every path)
    outcome: ToolOutcome | None = None


async def run_turn(host: TurnHost, claimed: list[UserMessage]) -> TurnEndReason:
    """Run the host's turn (already started: ``turn/start`` and the first claim are logged)."""
    return await _Turn(host).run(claimed)


class _Turn:
    def __init__(self, host: TurnHost) -> None:
        self.host = host
        self.turn = host.turn
        self.signal = host.controller.signal
        self.ended = False
        self.step = 0

    def write(self, data: Any) -> None:
        self.host.log.write(data)

    async def run(self, claimed: list[UserMessage]) -> TurnEndReason:
        host, signal = self.host, self.signal
        reason: TurnEndReason | None = None
        sticky_max_tokens = False
        try:
            first = True
            while True:
                signal.throw_if_aborted()
                if not first:
                    claimed = host.inbox.claim_step()
                first_step = first
                first = False
                # Prompt assembly: the system prompt is static in this version (a checkpoint).
                signal.throw_if_aborted()
                verdict = await call_pre_step(host.hooks, claimed, self.turn, self.step + 1, signal)
                if isinstance(verdict, Reject):
                    reason = Blocked(verdict.by)
                    return reason
                claimed = list(verdict.messages)
                signal.throw_if_aborted()
                if first_step and not claimed:
                    reason = Completed()  # nothing to do: a turn with no step
                    return reason
                self.step += 1
                host.on_step(self.step)
                signal.throw_if_aborted()
                self.write(StepStart(self.turn, self.step))
                try:
                    for message in claimed:
                        self.write(UserMessageEntered(self.turn, self.step, message))
                    signal.throw_if_aborted()
                    outcome = await self._step()
                finally:
                    self.write(StepEnd(self.turn, self.step))
                sticky_max_tokens = sticky_max_tokens or outcome.max_tokens
                signal.throw_if_aborted()
                if outcome.continuation or host.inbox.next_step:
                    continue
                for hook in host.hooks:
                    if isinstance(hook, TurnStopping):
                        await hook.fn(self.turn, signal=signal)
                signal.throw_if_aborted()
                # The re-check and turn/end share one synchronous section: no await in between.
                if host.inbox.next_step:
                    continue
                reason = MaxTokens() if sticky_max_tokens else Completed()
                self._end(reason)
                return reason
        except BaseException as e:
            if not isinstance(e, Exception):
                # Teardown (task cancellation) or an interpreter exit: record how the turn ended,
                # then let it propagate; cancellation is never swallowed.
                if signal.aborted and signal.reason is not None:
                    reason = TurnAborted(signal.reason)
                else:
                    reason = TurnFailed("the turn was torn down", ErrorCode.INTERNAL.value)
                self._end(reason)
                raise
            if signal.aborted:
                assert signal.reason is not None
                reason = TurnAborted(signal.reason)
            elif isinstance(e, LogWriteFailed):
                # The agent has published its own agent/error for the log failure.
                reason = TurnFailed(str(e), ErrorCode.LOG_WRITE_FAILED.value)
            elif isinstance(e, ModelError):
                reason = TurnFailed(str(e), e.code.value)
                host.on_error(e.code.value, str(e))
            elif isinstance(e, _InternalToolFailure):
                reason = TurnFailed(str(e), ErrorCode.INTERNAL.value)
                host.on_error(ErrorCode.INTERNAL.value, str(e))
            else:
                reason = TurnFailed(f"{type(e).__name__}: {e}", ErrorCode.INTERNAL.value)
                host.on_error(ErrorCode.INTERNAL.value, f"{type(e).__name__}: {e}")
            return reason
        finally:
            if reason is None:
                reason = TurnFailed("the turn ended without a reason", ErrorCode.INTERNAL.value)
            self._end(reason)

    def _end(self, reason: TurnEndReason) -> None:
        if self.ended:
            return
        self.ended = True
        self.write(TurnEnd(self.turn, reason))

    # -- the streaming step --------------------------------------------------------------------

    async def _step(self) -> _StepOutcome:
        host, signal, turn, step = self.host, self.signal, self.turn, self.step
        tools = tuple(host.registry.openai_schemas())
        # Compaction, before the request is built: the step's user messages are in the history
        # already, and a cancel here aborts it like any step (docs/agent-loop.md, Compaction).
        await host.context.fit(signal, tools, turn=turn, step=step)
        signal.throw_if_aborted()
        attempts = _Attempts()
        while True:
            request = ModelRequest(messages=tuple(host.request_messages()), tools=tools)
            try:
                reply = await self._reply(request, attempts)
            except ModelError as e:
                if signal.aborted or attempts.streamed or not host.context.is_overflow(e, request):
                    raise
                e = host.context.as_overflow(e, request)
                if attempts.compacted:
                    raise host.context.too_long(request, e) from None
                # Too long for the window: compact (forced) and send it once more.
                attempts.compacted = True
                self.write(LlmRetry(turn, step, attempts.count, _detail(e), 0.0))
                if not await host.context.fit(signal, tools, turn=turn, step=step, overflow=e):
                    raise host.context.too_long(request, e) from None
                signal.throw_if_aborted()
                continue
            host.context.observe(request, reply.usage)
            return await self._commit(reply)

    async def _reply(self, request: ModelRequest, attempts: _Attempts) -> Reply:
        """Stream one reply to ``request``; ``attempts`` counts this step's requests on."""
        host, signal, turn, step = self.host, self.signal, self.turn, self.step
        model_name = host.model.info.name
        reply = Reply()
        chunks = ChunkLog(host, turn, step)
        base = attempts.count

        async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
            nonlocal reply
            signal.throw_if_aborted()
            # Retries happen only before any data, so this is empty; but a retry's records
            # never overtake a delta that was shown.
            chunks.close()
            if n > 1 and error is not None:
                self.write(LlmRetry(turn, step, base + n - 1, _detail(error), float(delay or 0.0)))
            attempts.count = base + n
            self.write(LlmRequest(turn, step, attempts.count, model_name))
            chunks.attempt = attempts.count
            reply = Reply()  # retries happen only before any data: start the reply afresh
            await host.log.barrier()  # durable before each model request
            signal.throw_if_aborted()

        try:
            async for chunk in self._stream(request, on_attempt):
                # Per delta, before it is shown or buffered: a cancel drops nothing shown.
                signal.throw_if_aborted()
                delta = reply.add(chunk)
                if delta is not None:
                    attempts.streamed = True
                    chunks.add(delta)
            chunks.close()  # the stream's deltas are logged before anything that follows them
            signal.throw_if_aborted()  # right after the stream ends, too
        except BaseException:
            # Every delta shown (and so in the reply) reaches the log before the salvaged prefix
            # or the turn's end; the timer never fires after the step.
            chunks.abandon()
            if signal.aborted:
                self._salvage(reply)
            raise
        return reply

    def _stream(self, request: ModelRequest, on_attempt: OnAttempt) -> AsyncIterator[Chunk]:
        """The model's stream; an ``OnRequestError`` hook, if any, makes the retry decisions."""
        deciders = [h for h in self.host.hooks if isinstance(h, OnRequestError)]
        if not deciders:
            return self.host.model.stream(request, self.signal, on_attempt)
        hook, signal = deciders[0], self.signal

        async def decide(error: ModelError, attempt: int) -> float | None:
            verdict = await hook.fn(error, attempt, signal=signal)
            if isinstance(verdict, Retry):
                return verdict.delay
            if isinstance(verdict, GiveUp):
                return None
            raise TypeError(
                f"an OnRequestError hook returned {verdict!r}; it must return Retry(delay) or "
                "GiveUp()"
            )

        return self.host.model.stream(request, signal, on_attempt, decide_retry=decide)

    def _salvage(self, reply: Reply) -> None:
        """The interrupted prefix: visible text and reasoning only; every tool call dropped
        (interruption precedes dispatch, and a call without a result would corrupt the
        transcript). Nothing visible, nothing written."""
        blocks = reply.visible_blocks()
        if blocks:
            self.write(
                AssistantMessage(
                    self.turn,
                    self.step,
                    AssistantReply(tuple(blocks)),
                    "aborted",
                    usage=reply.usage,
                    interrupted=True,
                )
            )

    async def _commit(self, reply: Reply) -> _StepOutcome:
        finish: ReplyFinish = reply.finish or "stop"
        blocks: list[Any] = [
            TextBlock(s.text) if s.kind == "text" else ReasoningBlock(s.text)
            for s in reply.segments
            if s.text
        ]
        calls: list[_Call] = []
        for n, index in enumerate(sorted(reply.calls), start=1):
            raw = reply.calls[index]
            cid = call_id(self.turn, self.step, n)
            name = raw["name"] or ""
            tool = self.host.registry.get(name)
            arguments = reply.arguments(index)
            calls.append(_Call(cid, name, arguments, tool.parallel_safe if tool else False))
        dropped = None
        if finish == "length":
            dropped = len(calls) or None
            calls = []  # a length reply's calls are not kept, not validated, not run
        else:
            blocks += [
                ToolCallBlock(c.call_id, c.name, c.arguments, reply.calls[i]["provider_id"])
                for c, i in zip(calls, sorted(reply.calls), strict=True)
            ]
            if calls:
                finish = "tool_calls"
        self.write(
            AssistantMessage(
                self.turn,
                self.step,
                AssistantReply(tuple(blocks)),
                finish,
                usage=reply.usage,
                dropped_tool_calls=dropped,
            )
        )
        self.host.on_usage(reply.usage)
        if finish == "length":
            return _StepOutcome(max_tokens=True)
        if not calls:
            return _StepOutcome()
        await _Scheduler(self, calls).run()
        return _StepOutcome(continuation=True)


def _detail(error: ModelError) -> dict[str, Any]:
    """A model error as ``llm/retry`` records it."""
    detail: dict[str, Any] = {"code": error.code.value, "message": error.message}
    if error.status is not None:
        detail["status"] = error.status
    return detail


class _InternalToolFailure(Exception):
    """A call was answered ``INTERNAL`` (andon failed it, not the tool): the turn ends
    ``error`` then (docs/log-format.md, Error codes), once every call of the step has its result."""


class _Scheduler:
    """One step's tool calls: a run of parallel-safe calls executes concurrently up to
    ``max_parallel`` (a TaskGroup and a semaphore), an exclusive call alone; results are committed
    in model order; every call is answered exactly once, on every path.

    A failure of the scheduler itself (a raising hook, a failed log write, an andon bug) never
    abandons a running call: it stops the step's calls cooperatively through an internal signal,
    lets the TaskGroup drain them (its body ends normally; we never cancel a call's task), answers
    whatever has no result with ``INTERNAL``, and re-raises.
    """

    def __init__(self, turn: _Turn, calls: list[_Call]) -> None:
        self.t = turn
        self.calls = calls
        self.next = 0  # the first call whose tool/result is not written yet
        self.internal = AbortController()
        self.finished = asyncio.Event()  # some call's outcome has arrived
        self.internal_result: ToolOutcome | None = None  # the first call andon itself failed

    async def run(self) -> None:
        with any_signal(self.t.signal, self.internal.signal) as signal:
            failure: BaseException | None = None
            i = 0
            while i < len(self.calls) and not signal.aborted and failure is None:
                end = i + 1
                if self.calls[i].parallel_safe:
                    while end < len(self.calls) and self.calls[end].parallel_safe:
                        end += 1
                failure = await self._batch(self.calls[i:end], signal)
                i = end
            if failure is not None:
                for c in self.calls:
                    if c.outcome is None:
                        c.outcome = _internal_outcome(c.call_id, failure)
                while self._commit_next():
                    pass  # no PostTool after a failure: the turn is failing
                raise failure
        # Every call that never started: a skip result (a pair, if tool/call is not written).
        for c in self.calls:
            if c.outcome is None:
                c.outcome = aborted_before_dispatch(c.call_id)
        await self._commit_ready()
        failed = self.internal_result
        if failed is not None and not self.t.signal.aborted:
            message = failed.error.message if failed.error is not None else failed.content
            raise _InternalToolFailure(f"tool call {failed.call_id} failed inside andon: {message}")

    async def _batch(self, batch: list[_Call], signal: AbortSignal) -> BaseException | None:
        """Run one batch to its end; return the failure that stopped it, if any."""
        slots = asyncio.Semaphore(self.t.host.max_parallel)
        failure: BaseException | None = None
        async with asyncio.TaskGroup() as running:
            try:
                i = 0
                while i < len(batch):
                    await slots.acquire()
                    if signal.aborted:
                        slots.release()
                        break  # no further call starts
                    # Every slot free now takes a call: their tool/call records share one write
                    # and one fsync instead of one each (acquiring a free slot never waits).
                    group = [batch[i]]
                    while i + len(group) < len(batch) and not slots.locked():
                        await slots.acquire()
                        group.append(batch[i + len(group)])
                    i += len(group)
                    await self._start(group, signal, running, slots)
                    await self._commit_ready()
                while True:
                    await self._commit_ready()
                    if not any(c.dispatched and c.outcome is None for c in batch):
                        break
                    # No await between the check above and the wait: an outcome that arrives
                    # sets the event after this clear.
                    self.finished.clear()
                    await self.finished.wait()
            except BaseException as e:  # also a teardown's CancelledError: drain, then re-raise
                failure = e
                if not self.t.signal.aborted:
                    self.internal.abort(Hook("internal error in the tool scheduler"))
        return failure

    async def _run_one(self, call: _Call, signal: AbortSignal, slots: asyncio.Semaphore) -> None:
        try:
            outcome = await self._execute(call, signal)
            call.outcome = outcome
            if outcome.code is ErrorCode.INTERNAL and self.internal_result is None:
                # An andon bug answered this call: the rest of the step is stopped, not started.
                self.internal_result = outcome
                if not self.t.signal.aborted:
                    self.internal.abort(Hook("internal error in the tool executor"))
        except Exception as e:
            # The executor answers every call it was given; if it ever raises anyway, the call
            # still gets exactly one (INTERNAL) result and the step's other calls are stopped.
            call.outcome = _internal_outcome(call.call_id, e)
            if not self.t.signal.aborted:
                self.internal.abort(Hook("internal error in the tool executor"))
        finally:
            slots.release()
            self.finished.set()

    async def _start(
        self,
        group: list[_Call],
        signal: AbortSignal,
        running: asyncio.TaskGroup,
        slots: asyncio.Semaphore,
    ) -> None:
        """Write the group's tool/call records, make them durable (one barrier for the group),
        then ask the pre-tool hooks of each call in order and dispatch it, or answer it (denied,
        or the turn stopped meanwhile) and give its slot back."""
        t = self.t
        t.host.log.write_many(
            [ToolCall(t.turn, t.step, c.call_id, c.name, c.arguments) for c in group]
        )
        for call in group:
            call.written = True
        # A tool's side effects never begin before its tool/call is on disk.
        await t.host.log.barrier()
        for call in group:
            outcome = await self._admit(call, signal)
            if outcome is None:
                call.dispatched = True
                running.create_task(self._run_one(call, signal, slots))
            else:
                call.outcome = outcome
                slots.release()

    async def _admit(self, call: _Call, signal: AbortSignal) -> ToolOutcome | None:
        """Ask the pre-tool hooks about a call whose tool/call is durable. None: dispatch it."""
        t = self.t
        if signal.aborted:
            return aborted_before_dispatch(call.call_id)
        info = ToolCallInfo(call.call_id, call.name, call.arguments, t.turn, t.step)
        for hook in t.host.hooks:
            if isinstance(hook, PreTool):
                verdict = await hook.fn(info, signal=signal)
                if isinstance(verdict, Deny):
                    return _denied(call.call_id, verdict.reason)
        if signal.reason is not None:  # a hook may have cancelled the turn
            return aborted_before_dispatch(call.call_id)
        return None

    async def _execute(self, call: _Call, signal: AbortSignal) -> ToolOutcome:
        host = self.t.host
        request = ToolCallRequest(call.call_id, call.name, call.arguments, host.cwd, host.owner)
        tool = host.registry.get(call.name)
        if tool is not None and tool.kind == "supervisor":
            prepared = host.executor.prepare(request)
            if isinstance(prepared, ToolOutcome):
                return prepared
            assert tool.fn is not None
            result: ToolOutcome = await tool.fn(
                SubagentCall(host, call.call_id, prepared[1], signal)
            )
            return result
        return await host.executor.execute(request, signal, _LogObserver(self.t, call.call_id))

    def _commit_next(self) -> list[_Call]:
        """Write the next call's result (and its tool/call if missing), if it has one; and if it
        did not run, those of every ready call after it that did not run either, as one batch
        (one write: a stopped step's thousands of queued calls must not cost a record each,
        docs/log-format.md, Durability). The calls written, in model order; none if the next
        call has no outcome yet."""
        first = self.next
        if first >= len(self.calls) or self.calls[first].outcome is None:
            return []
        end = first + 1
        if self._not_run(self.calls[first]):
            while end < len(self.calls) and self._not_run(self.calls[end]):
                end += 1
        t = self.t
        batch: list[Any] = []
        for call in self.calls[first:end]:
            outcome = call.outcome
            assert outcome is not None and not call.committed
            if not call.written:
                batch.append(ToolCall(t.turn, t.step, call.call_id, call.name, call.arguments))
            batch.append(_result_record(t.turn, t.step, outcome))
        t.host.log.write_many(batch)
        done = self.calls[first:end]
        for call in done:
            call.written = True
            # Counted before any hook runs: a raising hook can never make a result be written
            # twice.
            call.committed = True
        self.next = end
        return done

    @staticmethod
    def _not_run(call: _Call) -> bool:
        return call.outcome is not None and call.outcome.ended_by == "not-run"

    async def _commit_ready(self) -> None:
        """Write results in model order, as far as they are available; ``PostTool`` hooks run
        once for each call that ran (never for one that did not: there is nothing to observe)."""
        while done := self._commit_next():
            for call in done:
                outcome = call.outcome
                assert outcome is not None
                if outcome.ended_by == "not-run":
                    continue
                t = self.t
                info = ToolCallInfo(call.call_id, call.name, call.arguments, t.turn, t.step)
                for hook in t.host.hooks:
                    if isinstance(hook, PostTool):
                        await hook.fn(info, outcome, signal=t.signal)


class _LogObserver(ExecutionObserver):
    """Writes a call's live events to the log and to subscribers."""

    def __init__(self, turn: _Turn, call_id: str) -> None:
        self.turn = turn
        self.call_id = call_id

    def on_started(self, started: Started, worker: str = "") -> None:
        t = self.turn
        t.write(
            ToolStarted(
                t.turn,
                t.step,
                self.call_id,
                worker,
                _HOST,
                started.pid,
                started.pgid,
                started.create_time,
                started.containment,
                started.cgroup,
            )
        )

    def on_signal(self, call_id: str, stage: SignalStage, at: float, targets: int) -> None:
        t = self.turn
        t.write(ToolSignal(t.turn, t.step, call_id, stage, round(at, 6), targets))

    def on_output(self, call_id: str, data: bytes) -> None:
        self.turn.host.log.publish(ToolOutput(call_id, clean_text(data)))


def _result_record(turn: int, step: int, outcome: ToolOutcome) -> ToolResult:
    error = outcome.error
    return ToolResult(
        turn,
        step,
        outcome.call_id,
        outcome.content,
        outcome.is_error,
        round(outcome.duration, 6),
        error=ToolErrorInfo(error.name, str(error.code), error.message) if error else None,
        exit=ExitStatus(outcome.exit_code, outcome.exit_signal) if outcome.ran else None,
        ended_by=outcome.ended_by,
        strays_killed=outcome.strays_killed or None,
        output_bytes=outcome.output_bytes if outcome.ran or outcome.output_bytes else None,
        output_file=outcome.output_file,
    )


def _denied(call_id: str, reason: str) -> ToolOutcome:
    return not_run(call_id, ErrorCode.DENIED, "Denied", f"denied by policy: {reason}")


def _internal_outcome(call_id: str, error: BaseException) -> ToolOutcome:
    message = f"internal error in andon's tool scheduler: {type(error).__name__}: {error}"
    if isinstance(error, asyncio.CancelledError):
        message = "the turn was torn down before this call had a result"
    return not_run(call_id, ErrorCode.INTERNAL, "InternalError", message)
