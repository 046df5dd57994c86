"""The turn driver: turns, steps, the streaming step with its salvaged prefix, and tool scheduling.

This module is large on purpose: it is the one place where the ordering rules of agent-loop.md
live together, and splitting them would scatter invariants that must be read side by side:

* ``turn/end`` is written exactly once per turn, in a ``finally``; the final inbox re-check and
  the completed ``turn/end`` happen in one synchronous section (no ``await`` in between), so a
  steer that arrives during the turn-stopping hooks runs as another step instead of being stranded.
* ``step/end`` is written in a ``finally`` too, after every tool call of the step has its result.
* A failure is classified by ``signal.aborted``, never by the exception's type.
* Every tool call gets exactly one result in its step, in model order, on every path.
* The checkpoints (``throw_if_aborted``) sit where agent-loop.md puts them; the one before logging
  every stream chunk is what makes an interrupt feel instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from andon.base import (
    AbortController,
    AbortSignal,
    ErrorCode,
    Hook,
    LogWriteFailed,
    ModelError,
    any_signal,
    call_id,
)
from andon.llm import (
    Finish,
    ModelRequest,
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
from andon.supervisor._hooks import Deny, PostTool, PreTool, Reject, ToolCallInfo, call_pre_step
from andon.supervisor._outcome import ToolOutcome, not_run
from andon.supervisor._subagent import SubagentCall

if TYPE_CHECKING:
    from andon.supervisor._agent import Agent

__all__ = ["run_turn"]

_HOST = socket.gethostname()


@dataclass
class _StepOutcome:
    continuation: bool = False  # tool results are owed a continuation step
    max_tokens: bool = False


@dataclass
class _Reply:
    """A streaming reply being assembled, in the order the model produced it."""

    segments: list[list[str]] = field(default_factory=list)  # [kind, text] runs
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish: str | None = None

    def add(self, chunk: object) -> dict[str, Any] | None:
        """Fold one chunk in; return the delta as ``assistant/chunk`` logs it, if it is one."""
        match chunk:
            case TextDelta() | ReasoningDelta():
                kind = chunk.type
                if self.segments and self.segments[-1][0] == kind:
                    self.segments[-1][1] += chunk.text
                else:
                    self.segments.append([kind, chunk.text])
                return chunk.to_dict()
            case ToolCallDelta():
                call = self.calls.setdefault(
                    chunk.index, {"provider_id": None, "name": None, "arguments": ""}
                )
                if chunk.provider_id:
                    call["provider_id"] = chunk.provider_id
                if chunk.name:
                    call["name"] = chunk.name
                call["arguments"] += chunk.arguments
                return chunk.to_dict()
            case Usage():
                self.usage = {
                    "prompt_tokens": chunk.prompt_tokens,
                    "completion_tokens": chunk.completion_tokens,
                }
            case Finish():
                self.finish = chunk.reason
        return None

    def visible_blocks(self) -> list[TextBlock | ReasoningBlock]:
        """Text and reasoning blocks with non-whitespace content, in order."""
        blocks: list[TextBlock | ReasoningBlock] = []
        for kind, text in self.segments:
            if text.strip():
                blocks.append(TextBlock(text) if kind == "text" else ReasoningBlock(text))
        return blocks


@dataclass
class _Call:
    call_id: str
    name: str
    arguments: str
    parallel_safe: bool
    written: bool = False  # tool/call is in the log
    outcome: ToolOutcome | None = None
    task: asyncio.Task[ToolOutcome] | None = None


async def run_turn(
    agent: Agent, turn: int, controller: AbortController, claimed: list[UserMessage]
) -> TurnEndReason:
    """Run turn ``turn`` (already started: ``turn/start`` and the first claim are logged)."""
    return await _Turn(agent, turn, controller).run(claimed)


class _Turn:
    def __init__(self, agent: Agent, turn: int, controller: AbortController) -> None:
        self.agent = agent
        self.turn = turn
        self.signal = controller.signal
        self.ended = False
        self.step = 0

    def write(self, data: Any) -> None:
        self.agent._write(data)

    async def run(self, claimed: list[UserMessage]) -> TurnEndReason:
        signal = self.signal
        reason: TurnEndReason | None = None
        sticky_max_tokens = False
        try:
            first = True
            while True:
                signal.throw_if_aborted()
                if not first:
                    claimed = self.agent._inbox.claim_step()
                first_step = first
                first = False
                await self.agent._assemble_prompt(signal)
                signal.throw_if_aborted()
                verdict = await call_pre_step(
                    self.agent._hooks, claimed, self.turn, self.step + 1, signal
                )
                if isinstance(verdict, Reject):
                    reason = Blocked(verdict.by)
                    return reason
                claimed = list(verdict.messages)
                signal.throw_if_aborted()
                if first_step and not claimed:
                    reason = Completed()  # nothing to do: a turn with no step
                    return reason
                self.step += 1
                self.agent._on_step(self.turn, self.step)
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
                if outcome.continuation or self.agent._inbox.next_step:
                    continue
                await self.agent._turn_stopping(self.turn, signal)
                signal.throw_if_aborted()
                # The re-check and turn/end share one synchronous section: no await in between.
                if self.agent._inbox.next_step:
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
                reason = TurnFailed(str(e), ErrorCode.LOG_WRITE_FAILED.value)
            elif isinstance(e, ModelError):
                reason = TurnFailed(str(e), e.code.value)
            else:
                reason = TurnFailed(f"{type(e).__name__}: {e}", ErrorCode.INTERNAL.value)
                self.agent._report_error(e)
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
        agent, signal, turn, step = self.agent, self.signal, self.turn, self.step
        request = ModelRequest(
            messages=tuple(agent._request_messages()), tools=tuple(agent._tool_schemas())
        )
        reply = _Reply()
        attempt = 0

        async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
            nonlocal attempt, reply
            signal.throw_if_aborted()
            if n > 1 and error is not None:
                detail: dict[str, Any] = {"code": error.code.value, "message": error.message}
                if error.status is not None:
                    detail["status"] = error.status
                self.write(LlmRetry(turn, step, n - 1, detail, float(delay or 0.0)))
            self.write(LlmRequest(turn, step, n, agent._model_name))
            attempt = n
            reply = _Reply()  # retries happen only before any data: start the reply afresh
            await agent._barrier()  # durable before each model request
            signal.throw_if_aborted()

        try:
            async for chunk in agent._model.stream(request, signal, on_attempt):
                signal.throw_if_aborted()  # before logging every chunk
                delta = reply.add(chunk)
                if delta is not None:
                    self.write(AssistantChunk(turn, step, attempt, (delta,)))
            signal.throw_if_aborted()  # right after the stream ends, too
        except BaseException:
            if signal.aborted:
                self._salvage(reply)
            raise
        return await self._commit(reply)

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
            TextBlock(text) if kind == "text" else ReasoningBlock(text)
            for kind, text in reply.segments
            if text
        ]
        calls: list[_Call] = []
        for n, index in enumerate(sorted(reply.calls), start=1):
            raw = reply.calls[index]
            cid = call_id(self.turn, self.step, n)
            name = raw["name"] or ""
            tool = self.agent._registry.get(name)
            calls.append(_Call(cid, name, raw["arguments"], tool.parallel_safe if tool else False))
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
        self.agent._add_usage(reply.usage)
        if finish == "length":
            return _StepOutcome(max_tokens=True)
        if not calls:
            return _StepOutcome()
        await self._run_tools(calls)
        return _StepOutcome(continuation=True)

    # -- tool scheduling -----------------------------------------------------------------------

    async def _run_tools(self, calls: list[_Call]) -> None:
        """Run the step's calls: parallel-safe runs concurrently up to ``max_parallel``, an
        exclusive call alone; results committed in model order; every call answered."""
        internal = AbortController()  # stops our own calls if the scheduler itself fails
        with any_signal(self.signal, internal.signal) as signal:
            committed = 0
            try:
                i = 0
                while i < len(calls) and not signal.aborted:
                    end = i + 1
                    if calls[i].parallel_safe:
                        while end < len(calls) and calls[end].parallel_safe:
                            end += 1
                    committed = await self._run_batch(calls, i, end, signal, committed)
                    i = end
            except BaseException as e:
                if not self.signal.aborted:
                    internal.abort(Hook("internal error in the tool scheduler"))
                running = [c.task for c in calls if c.task is not None and not c.task.done()]
                if running:
                    await asyncio.gather(*running, return_exceptions=True)
                for c in calls:
                    if c.task is not None and c.task.done() and c.outcome is None:
                        with contextlib.suppress(BaseException):
                            c.outcome = c.task.result()
                    if c.outcome is None:
                        c.outcome = _internal_outcome(c.call_id, e)
                committed = await self._commit_ready(calls, committed, post_hooks=False)
                raise
            # Every call that never started: a skip result (a pair, if tool/call is not written).
            for c in calls:
                if c.outcome is None:
                    c.outcome = aborted_before_dispatch(c.call_id)
            await self._commit_ready(calls, committed)

    async def _run_batch(
        self, calls: list[_Call], start: int, end: int, signal: AbortSignal, committed: int
    ) -> int:
        cap = max(1, self.agent._max_parallel)
        nxt = start
        running: set[asyncio.Task[ToolOutcome]] = set()
        while True:
            while nxt < end and len(running) < cap and not signal.aborted:
                call = calls[nxt]
                nxt += 1
                outcome = await self._start_call(call, signal)
                if outcome is not None:
                    call.outcome = outcome
                else:
                    call.task = asyncio.create_task(self._execute(call, signal))
                    running.add(call.task)
            committed = await self._commit_ready(calls, committed)
            if not running:
                return committed
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                running.discard(task)
                owner = next(c for c in calls if c.task is task)
                owner.outcome = task.result()

    async def _start_call(self, call: _Call, signal: AbortSignal) -> ToolOutcome | None:
        """Write tool/call, make it durable, ask the pre-tool hooks. None: dispatch it."""
        self.write(ToolCall(self.turn, self.step, call.call_id, call.name, call.arguments))
        call.written = True
        # A tool's side effects never begin before its tool/call is on disk.
        await self.agent._barrier()
        if signal.aborted:
            return aborted_before_dispatch(call.call_id)
        info = ToolCallInfo(call.call_id, call.name, call.arguments, self.turn, self.step)
        for hook in self.agent._hooks:
            if isinstance(hook, PreTool):
                verdict = await hook.fn(info, signal=signal)
                if isinstance(verdict, Deny):
                    return _denied(call.call_id, verdict.reason)
        if signal.reason is not None:  # a hook may have cancelled the turn
            return aborted_before_dispatch(call.call_id)
        return None

    async def _execute(self, call: _Call, signal: AbortSignal) -> ToolOutcome:
        request = ToolCallRequest(
            call.call_id, call.name, call.arguments, self.agent._cwd, self.agent._owner
        )
        tool = self.agent._registry.get(call.name)
        if tool is not None and tool.kind == "supervisor":
            prepared = self.agent._executor.prepare(request)
            if isinstance(prepared, ToolOutcome):
                return prepared
            assert tool.fn is not None
            result: ToolOutcome = await tool.fn(
                SubagentCall(self.agent, call.call_id, prepared[1], signal)
            )
            return result
        observer = _LogObserver(self, call.call_id)
        return await self.agent._executor.execute(request, signal, observer)

    async def _commit_ready(
        self, calls: list[_Call], committed: int, *, post_hooks: bool = True
    ) -> int:
        """Write results in model order, as far as they are available."""
        while committed < len(calls) and calls[committed].outcome is not None:
            call = calls[committed]
            outcome = call.outcome
            assert outcome is not None
            if not call.written:
                self.write(ToolCall(self.turn, self.step, call.call_id, call.name, call.arguments))
                call.written = True
            self.write(_result_record(self.turn, self.step, outcome))
            committed += 1
            if post_hooks:
                info = ToolCallInfo(call.call_id, call.name, call.arguments, self.turn, self.step)
                for hook in self.agent._hooks:
                    if isinstance(hook, PostTool):
                        await hook.fn(info, outcome, signal=self.signal)
        return committed


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
        self.turn.agent._publish_live(
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
    return not_run(call_id, ErrorCode.INTERNAL, "InternalError", message)
