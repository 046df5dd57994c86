"""Hooks (re-exported from ``andon.supervisor``)."""

from andon.supervisor import (
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

__all__ = [
    "Allow",
    "Deny",
    "Enter",
    "GiveUp",
    "OnRequestError",
    "PostTool",
    "PreStep",
    "PreTool",
    "Reject",
    "Retry",
    "ToolCallInfo",
    "TurnBudget",
    "TurnStopping",
]
