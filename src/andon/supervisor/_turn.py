"""The turn driver: turns, steps, the streaming step with its salvaged prefix, and tool scheduling.

This module is large on purpose: it is the one place where the ordering rules of agent-loop.md
live together, and splitting them would scatter invariants that must be read side by side:

* ``turn/end`` is written exactly once per turn, in a ``finally``; the final inbox re-check and
  the completed ``turn/end`` happen in one synchronous section (no ``await`` in between), so a
  steer that arrives during the turn-stopping hooks runs as another step instead of being stranded.
* ``step/end`` is written in a ``finally`` too, after every tool call of the step has its result.
* A failure is classified by ``signal.aborted``, never by the exception's type.
* Every tool call gets exactly one result in its step, in model order, on every path.
* The checkpoints (``throw_if_aborted``) sit where agent-loop.md puts them; the one before
  handling every stream chunk is what makes an interrupt feel instant.
* Stream deltas reach subscribers one by one, as they arrive (live ``assistant/delta`` events),
  and the log coalesced (:class:`_ChunkLog`): whatever was shown is in an ``assistant/chunk``
  record before anything that ends or follows the stream is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from andon.base import (
    AbortController,
    AbortSignal,
    Clock,
    ErrorCode,
    Hook,
    LogWriteFailed,
    ModelError,
    Timer,
    any_signal,
    call_id,
)
from andon.llm import (
    Chunk,
    Finish,
    ModelRequest,
    OnAttempt,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from andon.protocol import Started
from andon.session import (
    AssistantChunk,
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
from andon.supervisor._subagent import SubagentCall

__all__ = ["run_turn"]

_HOST = socket.gethostname()

CHUNK_FLUSH_AFTER = 0.016
"""Seconds after its first delta that a buffered ``assistant/chunk`` record is written (records.md:
at most one record per 16 ms or 4 KiB of deltas)."""
CHUNK_FLUSH_BYTES = 4096
"""Bytes of buffered delta text (UTF-8) at which the record is written at once."""


@dataclass
class _StepOutcome:
    continuation: bool = False  # tool results are owed a continuation step
    max_tokens: bool = False


@dataclass
class _Segment:
    """One run of text or reasoning; its pieces are joined once, when the reply is used (adding
    to one growing string would copy the whole run at every delta: quadratic in the reply)."""

    kind: str
    pieces: list[str]

    @property
    def text(self) -> str:
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""


@dataclass
class _Reply:
    """A streaming reply being assembled, in the order the model produced it."""

    segments: list[_Segment] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # arguments: list of pieces
    usage: dict[str, Any] | None = None
    finish: str | None = None

    def add(self, chunk: object) -> dict[str, Any] | None:
        """Fold one chunk in; return the delta as ``assistant/chunk`` logs it, if it is one."""
        match chunk:
            case TextDelta() | ReasoningDelta():
                kind = chunk.type
                if self.segments and self.segments[-1].kind == kind:
                    self.segments[-1].pieces.append(chunk.text)
                else:
                    self.segments.append(_Segment(kind, [chunk.text]))
                return chunk.to_dict()
            case ToolCallDelta():
                call = self.calls.setdefault(
                    chunk.index, {"provider_id": None, "name": None, "arguments": []}
                )
                if chunk.provider_id:
                    call["provider_id"] = chunk.provider_id
                if chunk.name:
                    call["name"] = chunk.name
                call["arguments"].append(chunk.arguments)
                return chunk.to_dict()
            case Usage():
                # Every count the provider reported (the optional ones only when reported).
                self.usage = dict(chunk.to_dict())
            case Finish():
                self.finish = chunk.reason
        return None

    def arguments(self, index: int) -> str:
        return "".join(self.calls[index]["arguments"])

    def visible_blocks(self) -> list[TextBlock | ReasoningBlock]:
        """Text and reasoning blocks with non-whitespace content, in order."""
        blocks: list[TextBlock | ReasoningBlock] = []
        for segment in self.segments:
            text = segment.text
            if text.strip():
                blocks.append(TextBlock(text) if segment.kind == "text" else ReasoningBlock(text))
        return blocks


class _ChunkLog:
    """The deltas of one reply on their way to subscribers and to the log.

    Each delta is published live (``assistant/delta``, no ``seq``) the moment it is handled, and
    buffered for the log: one ``assistant/chunk`` record per flush, adjacent deltas of one kind
    merged inside it (text with text, reasoning with reasoning, argument fragments of one tool
    call), so folding the record's deltas gives exactly what folding the originals gives.

    A flush happens at ``CHUNK_FLUSH_BYTES`` of buffered text, and ``CHUNK_FLUSH_AFTER`` after
    the first buffered delta: checked at each delta (a fast stream may never yield to the loop,
    so a timer alone could fire late) and by a clock timer (a model that stalls after one delta
    is in the log ~16 ms later, not when the stall ends). The step flushes explicitly
    before everything that must follow the deltas: the end of the stream, ``assistant/message``
    (also a salvaged prefix, whose text must be in the chunks), a retry's records, and on every
    path that ends the stream by raising.

    The timer writes from a loop callback, where an exception has no one to go to: it is kept
    and raised by the step's next call here.
    """

    __slots__ = (
        "attempt",
        "clock",
        "deadline",
        "entries",
        "failure",
        "publish",
        "size",
        "step",
        "timer",
        "turn",
        "write",
    )

    def __init__(self, host: TurnHost, turn: int, step: int) -> None:
        self.write = host.log.write
        self.publish = host.log.publish
        self.clock: Clock = host.clock
        self.turn = turn
        self.step = step
        self.attempt = 0
        # (head: the delta without its text, the key of its text, the text pieces)
        self.entries: list[tuple[dict[str, Any], str, list[str]]] = []
        self.size = 0
        self.deadline = 0.0
        self.timer: Timer | None = None
        self.failure: Exception | None = None

    def add(self, delta: dict[str, Any]) -> None:
        """One delta, as it arrives: shown live now, logged at the next flush."""
        self.raise_failure()
        self.publish(
            {
                "type": "assistant/delta",
                "turn": self.turn,
                "step": self.step,
                "attempt": self.attempt,
                "delta": delta,
            }
        )
        key = "arguments" if delta["type"] == "tool_call" else "text"
        text: str = delta[key]
        if not self._merge(delta, key, text):
            head = {k: v for k, v in delta.items() if k != key}
            self.entries.append((head, key, [text]))
        self.size += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        now = self.clock.monotonic()
        if self.timer is None:  # the first delta of this record
            self.deadline = now + CHUNK_FLUSH_AFTER
            self.timer = self.clock.call_at(self.deadline, self._on_timer)
        elif now >= self.deadline:
            self.flush()
            return
        if self.size >= CHUNK_FLUSH_BYTES:
            self.flush()

    def _merge(self, delta: dict[str, Any], key: str, text: str) -> bool:
        if not self.entries:
            return False
        head, last_key, pieces = self.entries[-1]
        if head["type"] != delta["type"] or last_key != key:
            return False
        if key == "arguments" and (
            head.get("index") != delta.get("index") or "provider_id" in delta or "name" in delta
        ):
            return False  # another call, or a fragment that names the call: its own delta
        pieces.append(text)
        return True

    def flush(self) -> None:
        """Write what is buffered as one ``assistant/chunk`` record (nothing if empty)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.entries:
            return
        deltas = tuple({**head, key: "".join(pieces)} for head, key, pieces in self.entries)
        self.entries = []
        self.size = 0
        self.write(AssistantChunk(self.turn, self.step, self.attempt, deltas))

    def close(self) -> None:
        """The stream has ended: everything shown is now logged (or the failure raised)."""
        self.raise_failure()
        self.flush()

    def abandon(self) -> None:
        """Flush on a path that is already raising: the failure in flight is the one that ends
        the step. A log that cannot be written has been remembered by the agent (LogPort), and
        the next write of the step raises it again."""
        with contextlib.suppress(Exception):
            self.flush()

    def raise_failure(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _on_timer(self) -> None:
        self.timer = None
        try:
            self.flush()
        except Exception as e:  # a loop callback: keep it for the step to raise
            if self.failure is None:
                self.failure = e


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
        request = ModelRequest(
            messages=tuple(host.request_messages()), tools=tuple(host.registry.openai_schemas())
        )
        model_name = host.model.info.name
        reply = _Reply()
        chunks = _ChunkLog(host, turn, step)

        async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
            nonlocal reply
            signal.throw_if_aborted()
            # Retries happen only before any data, so this is empty; but a retry's records
            # never overtake a delta that was shown.
            chunks.close()
            if n > 1 and error is not None:
                detail: dict[str, Any] = {"code": error.code.value, "message": error.message}
                if error.status is not None:
                    detail["status"] = error.status
                self.write(LlmRetry(turn, step, n - 1, detail, float(delay or 0.0)))
            self.write(LlmRequest(turn, step, n, model_name))
            chunks.attempt = n
            reply = _Reply()  # retries happen only before any data: start the reply afresh
            await host.log.barrier()  # durable before each model request
            signal.throw_if_aborted()

        try:
            async for chunk in self._stream(request, on_attempt):
                # Per delta, before it is shown or buffered: a cancel drops nothing shown.
                signal.throw_if_aborted()
                delta = reply.add(chunk)
                if delta is not None:
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
        return await self._commit(reply)

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

    def _salvage(self, reply: _Reply) -> None:
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

    async def _commit(self, reply: _Reply) -> _StepOutcome:
        finish = reply.finish or "stop"
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
                finish,  # type: ignore[arg-type]
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


class _InternalToolFailure(Exception):
    """A call was answered ``INTERNAL`` (andon failed it, not the tool): records.md has the turn
    end ``error`` then, once every call of the step has its result."""


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
                while self._commit_next() is not None:
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
                for call in batch:
                    await slots.acquire()
                    if signal.aborted:
                        slots.release()
                        break  # no further call starts
                    outcome = await self._start(call, signal)
                    if outcome is None:
                        call.dispatched = True
                        running.create_task(self._run_one(call, signal, slots))
                    else:
                        call.outcome = outcome
                        slots.release()
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

    async def _start(self, call: _Call, signal: AbortSignal) -> ToolOutcome | None:
        """Write tool/call, make it durable, ask the pre-tool hooks. None: dispatch it."""
        t = self.t
        t.write(ToolCall(t.turn, t.step, call.call_id, call.name, call.arguments))
        call.written = True
        # A tool's side effects never begin before its tool/call is on disk.
        await t.host.log.barrier()
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

    def _commit_next(self) -> _Call | None:
        """Write the next call's result (and its tool/call if missing), if it has one."""
        if self.next >= len(self.calls) or self.calls[self.next].outcome is None:
            return None
        call = self.calls[self.next]
        outcome = call.outcome
        assert outcome is not None and not call.committed
        t = self.t
        if not call.written:
            t.write(ToolCall(t.turn, t.step, call.call_id, call.name, call.arguments))
            call.written = True
        t.write(_result_record(t.turn, t.step, outcome))
        # Counted before any hook runs: a raising hook can never make a result be written twice.
        call.committed = True
        self.next += 1
        return call

    async def _commit_ready(self) -> None:
        """Write results in model order, as far as they are available; ``PostTool`` hooks run
        once for each call that ran (never for one that did not: there is nothing to observe)."""
        while (call := self._commit_next()) is not None:
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

    def on_signal(self, call_id: str, stage: str, at: float, targets: int) -> None:
        t = self.turn
        t.write(ToolSignal(t.turn, t.step, call_id, stage, round(at, 6), targets))  # type: ignore[arg-type]

    def on_output(self, call_id: str, data: bytes) -> None:
        self.turn.host.log.publish(
            {"type": "tool/output", "call_id": call_id, "text": data.decode("utf-8", "replace")}
        )


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
