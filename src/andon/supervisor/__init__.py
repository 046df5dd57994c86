"""The supervisor layer: the worker pool, the tool executor (grace timeline) and, above them, the
agent.

``__all__`` is what a user builds with: the agent and ``open_agent`` with their defaults, the hooks
and their answers, the pool, its config and the launchers (with the types a custom launcher
implements), and the executor with its request, observer and outcome for driving calls without an
agent. What the pool and the executor say to each other (leases, ``WorkerGone``) stays inside."""

from andon.supervisor._agent import Agent, Status
from andon.supervisor._command import CommandLauncher
from andon.supervisor._container import ContainerLauncher, Mount, host_mounts
from andon.supervisor._executor import ExecutionObserver, ToolCallRequest, ToolExecutor
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
from andon.supervisor._instructions import (
    INSTRUCTIONS_FILE,
    MAX_INSTRUCTION_BYTES,
    FoundInstructions,
    find_project_instructions,
)
from andon.supervisor._launch import LaunchedWorker, PoolSetup, WorkerLauncher, WorkerSpec
from andon.supervisor._open import DEFAULT_SYSTEM_PROMPT, SECRET_ENV, open_agent
from andon.supervisor._outcome import StageMark, ToolOutcome
from andon.supervisor._pod import PodLauncher
from andon.supervisor._pool import TcpListen, WorkerPool, WorkerPoolConfig
from andon.supervisor._pool_watch import PoolObserver, PoolStatistics
from andon.supervisor._subagent import subagent_tool

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "INSTRUCTIONS_FILE",
    "MAX_INSTRUCTION_BYTES",
    "SECRET_ENV",
    "Agent",
    "Allow",
    "CommandLauncher",
    "ContainerLauncher",
    "Deny",
    "Enter",
    "ExecutionObserver",
    "ForkserverLauncher",
    "FoundInstructions",
    "GiveUp",
    "LaunchedWorker",
    "Mount",
    "OnRequestError",
    "PodLauncher",
    "PoolObserver",
    "PoolSetup",
    "PoolStatistics",
    "PostTool",
    "PreStep",
    "PreTool",
    "Reject",
    "Retry",
    "StageMark",
    "Status",
    "TcpListen",
    "ToolCallInfo",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolOutcome",
    "TurnBudget",
    "TurnStopping",
    "WorkerLauncher",
    "WorkerPool",
    "WorkerPoolConfig",
    "WorkerSpec",
    "find_project_instructions",
    "host_mounts",
    "open_agent",
    "subagent_tool",
]
