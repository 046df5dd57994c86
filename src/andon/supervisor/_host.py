"""The turn host: the one explicit port through which a turn (and a supervisor tool) reaches its
agent.

The :class:`~andon.supervisor.Agent` builds a :class:`TurnHost` for each turn. The turn driver
(``_turn.py``) and the subagent tool (``_subagent.py``) take it and import no ``Agent``: everything
a turn may touch is a field here, so what a turn can do to its agent is read in one place, and the
agent's private state stays private. Layering inside the supervisor is then one-way::

    _context  <-  _host  <-  _turn, _subagent  <-  _agent  <-  _open

A host is frozen and per turn: a stale host held by a timer or a hook of an earlier turn reaches
only that turn's controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from andon.base import AbortController, Cause, Clock
from andon.llm import Model
from andon.session import AgentEvent, EventData, LiveEvent, Record, SessionLog
from andon.supervisor._context import ContextKeeper
from andon.supervisor._executor import ToolExecutor
from andon.supervisor._hooks import HookSpec
from andon.supervisor._inbox import Inbox
from andon.workers import ToolRegistry

__all__ = ["ChildAgent", "ChildFactory", "LogPort", "TurnHost"]


@dataclass(frozen=True)
class LogPort:
    """The agent's log as a turn sees it.

    ``write`` appends a record (raising ``LogWriteFailed``, which the agent also remembers);
    ``write_many`` appends several as one batch (one write, docs/log-format.md, Durability);
    ``barrier`` makes everything written so far durable; ``publish`` sends a live event (one that
    carries no ``seq`` and is never logged) to the agent's subscribers.
    """

    write: Callable[[EventData], Record]
    write_many: Callable[[Sequence[EventData]], list[Record]]
    barrier: Callable[[], Awaitable[None]]
    publish: Callable[[LiveEvent], None]


class ChildAgent(Protocol):
    """What a supervisor tool may do with a child agent (an ``Agent`` satisfies it)."""

    usage: dict[str, int]  # its running token totals, added to the parent's when it ends

    def followup(self, text: str) -> str: ...

    def cancel(self, cause: Cause, *, keep_inbox: bool = False, force: bool = False) -> None: ...

    async def when_idle(self) -> None: ...

    async def aclose(self) -> None: ...

    def events(self, since_seq: int | None = None) -> AsyncIterator[AgentEvent]: ...


class ChildFactory(Protocol):
    """Make a child agent on ``log`` sharing this agent's executor, registry, clock, cwd and
    parallelism; its tasks belong to ``tasks`` (which the caller owns and awaits)."""

    def __call__(
        self,
        *,
        log: SessionLog,
        model: Model,
        system_prompt: str,
        records: Sequence[Record],
        tasks: asyncio.TaskGroup,
    ) -> ChildAgent: ...


@dataclass(frozen=True)
class TurnHost:
    """Everything one turn may use. Built by the agent when the turn starts."""

    turn: int
    controller: AbortController  # this turn's, installed before turn/start
    model: Model
    registry: ToolRegistry
    executor: ToolExecutor
    hooks: tuple[HookSpec, ...]
    inbox: Inbox
    log: LogPort
    clock: Clock
    cwd: str
    session_dir: Path
    owner: str | None  # the session id: half of every call's process tag
    max_parallel: int
    open_child: ChildFactory
    # The model-visible request: the system prompt and the folded history, built at call time.
    request_messages: Callable[[], list[dict[str, Any]]]
    # The context window: compaction before a request, calibration after it.
    context: ContextKeeper
    # The agent's bookkeeping at a step start (phase step, step budgets) and after a reply.
    on_step: Callable[[int], None]
    on_usage: Callable[[dict[str, Any] | None], None]
    # A failure that is andon's own (or a hook's, or the model's): an ``agent/error`` event.
    on_error: Callable[[str, str], None]
