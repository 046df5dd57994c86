"""Hooks: async callables the agent calls at fixed points of a turn, each given the turn's signal.

``PreStep(fn)``: ``fn(messages, turn, step, *, signal) -> Enter(messages) | Reject(by)``
``TurnStopping(fn)``: ``fn(turn, *, signal)``; may steer or inject to force another step
``PreTool(fn)``: ``fn(call, *, signal) -> Allow() | Deny(reason)``
``PostTool(fn)``: ``fn(call, result, *, signal)``
``TurnBudget(seconds=None, steps=None)``: cancels a turn that runs too long (built in)

A hook may call ``agent.cancel(Hook(reason))``. A hook that raises fails the turn (``error``),
unless the turn's signal has aborted, in which case the turn is ``aborted``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import final

from andon.base import AbortSignal
from andon.session import UserMessage

__all__ = [
    "Allow",
    "Deny",
    "Enter",
    "GiveUp",
    "HookSpec",
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


@final
@dataclass(frozen=True)
class ToolCallInfo:
    """What a tool hook is told about a call."""

    call_id: str
    name: str
    arguments: str
    turn: int
    step: int


@final
@dataclass(frozen=True)
class Enter:
    """Let the step run with these messages (possibly changed by the hook)."""

    messages: Sequence[UserMessage]


@final
@dataclass(frozen=True)
class Reject:
    """Do not run the step: the turn ends ``blocked`` by ``by``."""

    by: str


@final
@dataclass(frozen=True)
class Allow:
    pass


@final
@dataclass(frozen=True)
class Deny:
    """Do not run the call: it gets a ``DENIED`` result carrying ``reason``; the turn goes on."""

    reason: str


@final
@dataclass(frozen=True)
class Retry:
    delay: float


@final
@dataclass(frozen=True)
class GiveUp:
    pass


PreStepFn = Callable[..., Awaitable[Enter | Reject]]
TurnStoppingFn = Callable[..., Awaitable[None]]
PreToolFn = Callable[..., Awaitable[Allow | Deny]]
PostToolFn = Callable[..., Awaitable[None]]


@final
@dataclass(frozen=True)
class PreStep:
    fn: PreStepFn


@final
@dataclass(frozen=True)
class TurnStopping:
    fn: TurnStoppingFn


@final
@dataclass(frozen=True)
class PreTool:
    fn: PreToolFn


@final
@dataclass(frozen=True)
class PostTool:
    fn: PostToolFn


@final
@dataclass(frozen=True)
class OnRequestError:
    """Would replace the model adapter's own retry decision. Not built yet: the agent refuses it
    with ``NotImplementedError`` rather than silently ignoring it."""

    fn: Callable[..., Awaitable[Retry | GiveUp]]


@final
@dataclass(frozen=True)
class TurnBudget:
    """Cancel a turn with ``Hook("turn budget exceeded: …")`` after ``seconds`` or ``steps``."""

    seconds: float | None = None
    steps: int | None = None


HookSpec = PreStep | TurnStopping | PreTool | PostTool | OnRequestError | TurnBudget


async def call_pre_step(
    hooks: Sequence[HookSpec],
    messages: Sequence[UserMessage],
    turn: int,
    step: int,
    signal: AbortSignal,
) -> Enter | Reject:
    current = Enter(tuple(messages))
    for hook in hooks:
        if isinstance(hook, PreStep):
            verdict = await hook.fn(current.messages, turn, step, signal=signal)
            if isinstance(verdict, Reject):
                return verdict
            current = verdict
    return current
