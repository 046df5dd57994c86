"""The supervisor layer: the worker pool, the tool executor (grace timeline) and, above them, the
agent."""

from andon.supervisor._agent import Agent, Status
from andon.supervisor._executor import (
    ExecutionObserver,
    ToolCallRequest,
    ToolExecutor,
    aborted_before_dispatch,
)
from andon.supervisor._hooks import (
    Allow,
    Deny,
    Enter,
    GiveUp,
    OnRequestError,
    PostTool,
    PreStep,
    PreTool,
    Reject,
    Retry,
    ToolCallInfo,
    TurnBudget,
    TurnStopping,
)
from andon.supervisor._open import DEFAULT_SYSTEM_PROMPT, SECRET_ENV, open_agent
from andon.supervisor._outcome import StageMark, ToolOutcome
from andon.supervisor._pool import WorkerGone, WorkerLease, WorkerPool, WorkerPoolConfig
from andon.supervisor._subagent import SubagentCall, subagent_tool

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "SECRET_ENV",
    "Agent",
    "Allow",
    "Deny",
    "Enter",
    "ExecutionObserver",
    "GiveUp",
    "OnRequestError",
    "PostTool",
    "PreStep",
    "PreTool",
    "Reject",
    "Retry",
    "StageMark",
    "Status",
    "SubagentCall",
    "ToolCallInfo",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolOutcome",
    "TurnBudget",
    "TurnStopping",
    "WorkerGone",
    "WorkerLease",
    "WorkerPool",
    "WorkerPoolConfig",
    "aborted_before_dispatch",
    "open_agent",
    "subagent_tool",
]
