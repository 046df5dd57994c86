"""Tools that come from somewhere else than the registry: a provider (the MCP servers of
``andon.mcp``) says which tools the pool's workers must hold for it (never offered to the model),
and, once the pool runs and the session's id is known, opens and offers its tools for as long as
the agent lives (docs/tools.md, MCP servers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from andon.fleet import WorkerPool
from andon.session import EventData
from andon.workers import Tool

__all__ = ["ToolProvider"]


class ToolProvider(Protocol):
    """What ``open_agent(providers=...)`` takes."""

    @property
    def worker_tools(self) -> Sequence[Tool]:
        """Tools the pool's workers must hold for this provider; the model never sees them."""
        ...

    def open(
        self, workers: WorkerPool, owner: str, write: Callable[[EventData], object]
    ) -> AbstractAsyncContextManager[Sequence[Tool]]:
        """Start what the provider needs on ``workers`` (its calls tagged with ``owner``, the
        session's id) and yield the tools it offers; leaving the block stops all of it. Opened
        after the pool starts and closed, after the agent is disposed, before the pool stops.
        ``write`` appends a record to the session's log, marked ignorable (an andon that does
        not know its type skips it): what the provider started, for the log to tell."""
        ...
