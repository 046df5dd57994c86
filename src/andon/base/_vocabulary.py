"""The closed sets of words andon writes: on the wire, in the log and in ``andon run --json``.

Each set is a ``Literal`` (what the type checker sees) and a frozenset made from it (what a reader
checks a value against), declared once here so that the wire, the log records and the CLI cannot
drift apart. They are Literals rather than StrEnums because they travel as plain strings and are
copied from a wire message into a log record as they are (docs/log-format.md, Tool calls).
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias, get_args

__all__ = [
    "CANCEL_STAGES",
    "CONTAINMENTS",
    "ENDED_BY",
    "FINISH_REASONS",
    "MESSAGE_SOURCES",
    "REPLY_FINISHES",
    "SIGNAL_STAGES",
    "STREAMS",
    "TURN_END_KINDS",
    "CancelStage",
    "Containment",
    "ContainmentSetting",
    "EndedBy",
    "FinishReason",
    "MessageSource",
    "ReplyFinish",
    "SignalStage",
    "Stream",
    "TurnEndKind",
]

MessageSource: TypeAlias = Literal[
    "user", "steer", "inject", "hook", "tool-context", "output-schema"
]
"""Who entered a user message: a person, a steer or inject while a turn runs, a hook, a tool,
or ``andon run --output-schema`` asking again for an answer that did not match its schema."""

FinishReason: TypeAlias = Literal["stop", "tool_calls", "length"]
"""How the model said its reply ended (a provider's other reasons are errors, not replies)."""

ReplyFinish: TypeAlias = Literal[FinishReason, "aborted"]
"""How a reply in the log ended: the model's reason, or ``aborted`` (a cancel cut the stream)."""

CancelStage: TypeAlias = Literal["interrupt", "term", "kill"]
"""A rung of the grace ladder the supervisor asks a worker to take."""

SignalStage: TypeAlias = Literal["interrupt", "term", "kill", "sweep-term", "sweep-kill"]
"""A signal sent to a call's processes: a grace rung, or the sweep of escapees after it."""

EndedBy: TypeAlias = Literal[
    "exit",
    "interrupt",
    "term",
    "kill",
    "timeout-interrupt",
    "timeout-term",
    "timeout-kill",
    "worker-lost",
    "not-run",
]
"""What ended a tool call: its own exit, the rung that stopped it (after a cancel or a timeout),
the loss of its worker, or nothing because it never ran."""

Containment: TypeAlias = Literal["cgroup", "subreaper", "pgroup"]
"""How a call's processes are held together, strongest first (docs/workers.md, Containment
modes)."""

ContainmentSetting: TypeAlias = Literal["auto", Containment]
"""What a user may ask for: a mode, or ``auto`` (the strongest this machine allows)."""

Stream: TypeAlias = Literal["stdout", "stderr"]
"""Which output stream a chunk of a tool's output came from."""

TurnEndKind: TypeAlias = Literal[
    "completed", "max-tokens", "blocked", "aborted", "error", "interrupted"
]
"""The ``kind`` of a ``turn/end`` reason (docs/log-format.md, How a turn ends)."""

CANCEL_STAGES: Final[tuple[CancelStage, ...]] = get_args(CancelStage)
"""The rungs in the order a stop sends them; a later one supersedes an earlier one."""

MESSAGE_SOURCES: Final[frozenset[str]] = frozenset(get_args(MessageSource))
REPLY_FINISHES: Final[frozenset[str]] = frozenset(get_args(ReplyFinish))
SIGNAL_STAGES: Final[frozenset[str]] = frozenset(get_args(SignalStage))
FINISH_REASONS: Final[tuple[FinishReason, ...]] = get_args(FinishReason)
"""The model's reasons, in the order the docs list them."""

ENDED_BY: Final[frozenset[str]] = frozenset(get_args(EndedBy))
CONTAINMENTS: Final[frozenset[str]] = frozenset(get_args(Containment))
STREAMS: Final[frozenset[str]] = frozenset(get_args(Stream))
TURN_END_KINDS: Final[frozenset[str]] = frozenset(get_args(TurnEndKind))
