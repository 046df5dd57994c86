"""The supervisor layer: the tool executor (each call's grace ladder) and, above it, the agent.

It leases workers from the fleet (``andon.fleet``), asks the model (``andon.llm``) and appends
to the session's log (``andon.session``).

``__all__`` is what a user builds with: the agent and ``open_agent`` with their defaults, the hooks
and their answers, project instructions, and the executor with its request, observer and outcome
for driving calls without an agent (``Started``, the wire's message an observer is shown when a
call's process starts, is re-exported for it)."""

from andon.protocol import Started
from andon.supervisor._agent import Agent, Status
from andon.supervisor._executor import ExecutionObserver, ToolCallRequest, ToolExecutor
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
from andon.supervisor._open import DEFAULT_SYSTEM_PROMPT, SECRET_ENV, open_agent
from andon.supervisor._outcome import StageMark, ToolOutcome
from andon.supervisor._providers import ToolProvider
from andon.supervisor._subagent import subagent_tool

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "INSTRUCTIONS_FILE",
    "MAX_INSTRUCTION_BYTES",
    "SECRET_ENV",
    "Agent",
    "Allow",
    "Deny",
    "Enter",
    "ExecutionObserver",
    "FoundInstructions",
    "GiveUp",
    "OnRequestError",
    "PostTool",
    "PreStep",
    "PreTool",
    "Reject",
    "Retry",
    "StageMark",
    "Started",
    "Status",
    "ToolCallInfo",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolOutcome",
    "ToolProvider",
    "TurnBudget",
    "TurnStopping",
    "find_project_instructions",
    "open_agent",
    "subagent_tool",
]
