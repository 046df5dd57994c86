"""The supervisor layer: the worker pool, the tool executor (grace timeline) and, above them, the
agent."""

from andon.supervisor._agent import Agent, Status
from andon.supervisor._command import CommandLauncher
from andon.supervisor._container import ContainerLauncher, Mount, host_mounts
from andon.supervisor._executor import (
    ExecutionObserver,
    ToolCallRequest,
    ToolExecutor,
    aborted_before_dispatch,
)
from andon.supervisor._forkserver import ForkserverLauncher
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
from andon.supervisor._launch import LaunchedWorker, PoolSetup, WorkerLauncher, WorkerSpec
from andon.supervisor._open import DEFAULT_SYSTEM_PROMPT, SECRET_ENV, open_agent
from andon.supervisor._outcome import StageMark, ToolOutcome
from andon.supervisor._pod import PodLauncher
from andon.supervisor._pool import TcpListen, WorkerGone, WorkerLease, WorkerPool, WorkerPoolConfig
from andon.supervisor._subagent import SubagentCall, subagent_tool

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "SECRET_ENV",
    "Agent",
    "Allow",
    "CommandLauncher",
    "ContainerLauncher",
    "Deny",
    "Enter",
    "ExecutionObserver",
    "ForkserverLauncher",
    "GiveUp",
    "LaunchedWorker",
    "Mount",
    "OnRequestError",
    "PodLauncher",
    "PoolSetup",
    "PostTool",
    "PreStep",
    "PreTool",
    "Reject",
    "Retry",
    "StageMark",
    "Status",
    "SubagentCall",
    "TcpListen",
    "ToolCallInfo",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolOutcome",
    "TurnBudget",
    "TurnStopping",
    "WorkerGone",
    "WorkerLauncher",
    "WorkerLease",
    "WorkerPool",
    "WorkerPoolConfig",
    "WorkerSpec",
    "aborted_before_dispatch",
    "host_mounts",
    "open_agent",
    "subagent_tool",
]
