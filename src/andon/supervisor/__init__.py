"""The supervisor layer: the worker pool, the tool executor (grace timeline) and, above them, the
agent."""

from andon.supervisor._executor import (
    ExecutionObserver,
    ToolCallRequest,
    ToolExecutor,
    aborted_before_dispatch,
)
from andon.supervisor._outcome import StageMark, ToolOutcome
from andon.supervisor._pool import WorkerGone, WorkerLease, WorkerPool, WorkerPoolConfig

__all__ = [
    "ExecutionObserver",
    "StageMark",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolOutcome",
    "WorkerGone",
    "WorkerLease",
    "WorkerPool",
    "WorkerPoolConfig",
    "aborted_before_dispatch",
]
