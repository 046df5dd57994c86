"""The ``subagent`` tool: a child agent run inside the supervisor process.

A subagent is a *supervisor tool*: no worker runs it and it writes no ``tool/started``. The child
gets its own session folder, ``subagents/<call_id>/`` inside the parent's, and shares the parent's
worker pool and executor. Cancelling the parent's turn cancels the child with ``Parent()``; the
child drains its own tools through the grace policy like any turn. The child's last ``turn/end``
and its consumed-work fold decide what the parent's tool result says.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andon.base import AbortSignal, ErrorCode, Parent, __version__, session_id, show_name
from andon.llm import Model
from andon.protocol import ErrorInfo
from andon.session import (
    FORMAT_VERSION,
    AgentEvent,
    AssistantMessage,
    Blocked,
    Completed,
    MaxTokens,
    ModelInfo,
    SessionLog,
    SessionStart,
    SubagentEvent,
    TurnAborted,
    TurnEnd,
    TurnFailed,
    fold_consumed_work,
    read,
)
from andon.supervisor._host import TurnHost
from andon.supervisor._outcome import ToolOutcome
from andon.workers import Tool

__all__ = ["SubagentCall", "subagent_tool"]

_DEFAULT_PROMPT = (
    "You are a subagent: a helper given one task by another agent. Do the task with the tools "
    "you have, then answer with a short report of what you did and found."
)


@dataclass(frozen=True)
class SubagentCall:
    """What the driver hands a supervisor tool: the parent turn's host, the call and its signal."""

    host: TurnHost
    call_id: str
    arguments: dict[str, Any]
    signal: AbortSignal


def subagent_tool(
    model: Callable[[], Model],
    *,
    name: str = "subagent",
    system_prompt: str | None = None,
    description: str | None = None,
) -> Tool:
    """A tool that hands a task to a child agent; ``model()`` makes the child's model."""

    async def run(call: SubagentCall) -> ToolOutcome:
        return await _run_child(call, model(), system_prompt or _DEFAULT_PROMPT)

    return Tool(
        name=name,
        description=description
        or "Give a self-contained task to a subagent with its own tools; returns its report.",
        parameters={
            "type": "object",
            "properties": {"task": {"type": "string"}},
            "required": ["task"],
            "additionalProperties": False,
        },
        fn=run,
        kind="supervisor",
        parallel_safe=False,
    )


async def _run_child(call: SubagentCall, model: Model, prompt: str) -> ToolOutcome:
    host = call.host
    folder = host.session_dir / "subagents" / call.call_id
    started_at = host.clock.monotonic()
    log = SessionLog.open(folder, clock=host.clock)
    try:
        info = model.info
        first = log.append(
            SessionStart(
                FORMAT_VERSION,
                session_id(),
                __version__,
                host.clock.time(),
                show_name(host.cwd),
                ModelInfo(info.spec, info.provider, info.name),
                prompt,
                os.getpid(),
                socket.gethostname(),
            )
        )
        # The child's tasks (its driver, and the forwarder below) are children of this group:
        # the tool returns only when every one of them has ended.
        async with asyncio.TaskGroup() as tasks:
            child = host.open_child(
                log=log, model=model, system_prompt=prompt, records=[first], tasks=tasks
            )
            # The subscription starts here, synchronously, so the forwarder misses nothing the
            # child writes from its first turn/start on.
            stream = child.events()
            tasks.create_task(_forward(stream, host, call.call_id))
            # The parent's cancel reaches the child as Parent(); the link dies with the call.
            handle = call.signal.add_callback(lambda _cause: child.cancel(Parent()))
            try:
                child.followup(str(call.arguments["task"]))
                await child.when_idle()
            finally:
                handle.remove()
                await child.aclose()  # ends the child's event stream, and so the forwarder
                # What the child spent is the session's spending too (run/summary, cost).
                host.on_usage(dict(child.usage))
    finally:
        await log.aclose()
    return _outcome(call, folder, host.clock.monotonic() - started_at)


async def _forward(stream: AsyncIterator[AgentEvent], host: TurnHost, call_id: str) -> None:
    async for item in stream:
        host.log.publish(SubagentEvent(call_id, item))


def _outcome(call: SubagentCall, folder: Path, duration: float) -> ToolOutcome:
    records = read(folder)
    last_text = ""
    end: TurnEnd | None = None
    for record in records:
        if isinstance(record.data, AssistantMessage) and record.data.message.text.strip():
            last_text = record.data.message.text
        if isinstance(record.data, TurnEnd):
            end = record.data
    consumed = fold_consumed_work(records)
    where = f"[subagent log: subagents/{call.call_id}/events.jsonl]"
    note = "\n[queued work of the subagent was discarded unrun]" if consumed.dropped_unrun else ""
    reason = end.reason if end is not None else None
    error: ErrorInfo | None = None
    ended_by: Any = "exit"
    match reason:
        case Completed():
            content = last_text or "(the subagent finished without a report)"
        case MaxTokens():
            content = f"{last_text}\n[the subagent stopped at the model's length limit]"
        case TurnAborted(cause=cause):
            message = f"the subagent was aborted {cause.describe()}"
            content = f"Error: {message}" + (f"\nIts last words: {last_text}" if last_text else "")
            error = ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message=message)
            ended_by = "interrupt"
        case Blocked(by=by):
            message = f"the subagent was blocked by {by}"
            content = f"Error: {message}"
            error = ErrorInfo(name="SubagentBlocked", code=ErrorCode.TOOL_ERROR, message=message)
        case TurnFailed(message=failure):
            message = f"the subagent failed: {failure}"
            content = f"Error: {message}"
            error = ErrorInfo(name="SubagentFailed", code=ErrorCode.TOOL_ERROR, message=message)
        case _:
            message = "the subagent ended without a turn"
            content = f"Error: {message}"
            error = ErrorInfo(name="SubagentFailed", code=ErrorCode.TOOL_ERROR, message=message)
    return ToolOutcome(
        call_id=call.call_id,
        content=f"{content}{note}\n{where}",
        is_error=error is not None,
        ended_by=ended_by,
        duration=duration,
        error=error,
    )
