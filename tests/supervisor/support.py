"""Helpers for agent tests: an agent over a real session folder, real workers and a scripted
model, and ways to wait for log records instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import andon
from andon.base import GracePolicy, message_id, session_id
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.llm import Model, Scripted
from andon.session import (
    FORMAT_VERSION,
    AgentError,
    AgentEvent,
    InboxSpliced,
    LiveEvent,
    ModelInfo,
    Record,
    SessionLog,
    SessionStart,
    ToolOutput,
    UserMessage,
    check,
    history,
    read,
)
from andon.supervisor import Agent, ToolExecutor
from andon.workers import ToolRegistry
from tests.workers.pytools import registry as test_registry

L = TypeVar("L", bound=LiveEvent)


class Watcher:
    """Collects an agent's events from subscription on; tests wait on predicates over them."""

    def __init__(self, agent: Agent) -> None:
        self.items: list[AgentEvent] = []
        self._changed = asyncio.Event()
        # events() subscribes at the call, so nothing between here and the task's start is lost.
        self._task = asyncio.create_task(self._collect(agent.events()))

    async def _collect(self, stream: AsyncIterator[AgentEvent]) -> None:
        async for item in stream:
            self.items.append(item)
            self._changed.set()
            self._changed = asyncio.Event()

    async def wait(self, predicate: Callable[[AgentEvent], bool]) -> AgentEvent:
        while True:
            for item in self.items:
                if predicate(item):
                    return item
            await self._changed.wait()

    async def wait_type(self, type_: str, **data: Any) -> AgentEvent:
        """The first event of type ``type_`` (``tool/started``, ``assistant/delta``) with these
        attribute values (a record's on its data)."""

        def matches(event: AgentEvent) -> bool:
            fields = event.data if isinstance(event, Record) else event
            return event.type == type_ and all(
                getattr(fields, k, None) == v for k, v in data.items()
            )

        return await self.wait(matches)

    async def wait_output(self, text: str) -> ToolOutput:
        """The first live ``tool/output`` that contains ``text``."""
        found = await self.wait(lambda r: isinstance(r, ToolOutput) and text in r.text)
        assert isinstance(found, ToolOutput)
        return found

    async def wait_error(self) -> AgentError:
        """The first live ``agent/error``."""
        found = await self.wait(lambda r: isinstance(r, AgentError))
        assert isinstance(found, AgentError)
        return found

    def live(self, cls: type[L]) -> list[L]:
        """The live events of class ``cls`` seen so far, in order."""
        return [item for item in self.items if isinstance(item, cls)]

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@asynccontextmanager
async def agent_for(
    folder: Path,
    replies: Sequence[dict[str, Any]] | Model,
    *,
    tools: ToolRegistry | None = None,
    grace: GracePolicy | None = None,
    workers: int = 2,
    **options: Any,
) -> AsyncIterator[Agent]:
    model = replies if isinstance(replies, Model) else Scripted(list(replies))
    async with andon.open_agent(
        folder,
        model=model,
        tools=tools if tools is not None else test_registry(),
        pool=WorkerPoolConfig(size=workers, containment="subreaper"),
        grace=grace or GracePolicy(term_after=1.0, kill_after=1.0),
        **options,
    ) as agent:
        yield agent


def records(folder: Path) -> list[dict[str, Any]]:
    return [r.to_dict() for r in read(folder)]


def kinds(folder: Path, *, chunks: bool = False) -> list[str]:
    return [r["type"] for r in records(folder) if chunks or r["type"] != "assistant/chunk"]


def assert_sound(folder: Path) -> None:
    """The log passes every invariant and its history is a valid request."""
    recs = read(folder)
    assert check(recs) == []
    assert_valid_request(history(recs))


def assert_valid_request(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call answered by exactly one tool message right after; nothing extra."""
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            raise AssertionError(f"tool message without a call at {i}: {m}")
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            answers = [x["tool_call_id"] for x in messages[i + 1 : i + 1 + len(ids)]]
            assert answers == ids, f"calls {ids} answered by {answers}"
            i += len(ids)
        i += 1


def turn_ends(folder: Path) -> list[dict[str, Any]]:
    return [r["data"]["reason"] for r in records(folder) if r["type"] == "turn/end"]


DELEGATE = {"tool_calls": [{"name": "subagent", "arguments": {"task": "run the slow check"}}]}
CHILD_SLOW = [
    {
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "echo child-ready; exec sleep 1000"}}
        ]
    }
]


def parked_session(
    folder: Path, *, next_turn: Sequence[str] = (), next_step: Sequence[str] = ()
) -> None:
    """A log as a process that died with queued work leaves it: a session whose inbox holds these
    messages (disposal would have cleared them; only a crash leaves work parked)."""
    log = SessionLog.open(folder)
    log.append(start_record(folder))
    for target, texts in (("next-turn", next_turn), ("next-step", next_step)):
        for n, text in enumerate(texts):
            message = UserMessage(message_id(), text, "user" if target == "next-turn" else "inject")
            log.append(InboxSpliced(target=target, start=n, inserted=(message,)))  # type: ignore[arg-type]
    log.close()


def start_record(folder: Path) -> SessionStart:
    """A ``session/start`` for a log a test writes itself."""
    return SessionStart(
        FORMAT_VERSION,
        session_id(),
        andon.__version__,
        0.0,
        str(folder),
        ModelInfo("script:inline", "script", "scripted"),
        "p",
        os.getpid(),
        "h",
    )


@asynccontextmanager
async def agent_on(
    log: SessionLog, model: Scripted, folder: Path, **options: Any
) -> AsyncIterator[Agent]:
    """An ``Agent`` built directly on a log the test opened (with a seam of its own: a write or
    fsync function), one real worker, and a task group that ends with the block."""
    tools = test_registry()
    first = log.append(start_record(folder))
    async with (
        WorkerPool(WorkerPoolConfig(size=1, containment="subreaper"), tools) as pool,
        asyncio.TaskGroup() as tasks,
    ):
        yield Agent(
            log=log,
            model=model,
            executor=ToolExecutor(pool, tools, session_dir=folder),
            registry=tools,
            records=[first],
            system_prompt="p",
            cwd=str(folder),
            tasks=tasks,
            **options,
        )


class SummaryTripwire:
    """A real model with a hook inside its compaction summary streams: ``fire()`` runs when the
    ``at``-th chunk of the first summary stream is about to be handed on (0: before the first;
    past the last: once the stream has ended). Every other request passes through untouched."""

    def __init__(self, inner: Model, at: int, fire: Callable[[], None]) -> None:
        self.inner = inner
        self.at = at
        self.fire = fire
        self.fired = False

    @property
    def info(self) -> Any:
        return self.inner.info

    async def stream(self, request: Any, signal: Any, on_attempt: Any, **kw: Any) -> Any:
        from andon.llm import SUMMARY_MARKER

        summary = SUMMARY_MARKER in str(request.messages[-1].get("content"))
        n = 0
        async for chunk in self.inner.stream(request, signal, on_attempt, **kw):
            if summary and n == self.at and not self.fired:
                self.fired = True
                self.fire()
            n += 1
            yield chunk
        if summary and not self.fired:
            self.fired = True
            self.fire()


def chatty_job(steps: int, text: int) -> list[dict[str, Any]]:
    """``steps`` replies of ``text`` characters of prose and a short bash call each (nothing the
    first tier could stub: only a summary makes room), then a final answer."""
    words = ("The build log shows the step went through as expected. " * (text // 50 + 1))[:text]
    replies: list[dict[str, Any]] = [
        {"text": words, "tool_calls": [{"name": "bash", "arguments": {"command": f"echo {n}"}}]}
        for n in range(steps)
    ]
    replies.append({"text": "done"})
    return replies
