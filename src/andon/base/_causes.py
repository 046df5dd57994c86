"""Cancel causes: why a turn was asked to stop.

A closed set of frozen values, compared by value and serialised as ``{"kind": ...}``. The first
cause given to a controller wins (see ``_abort``), so a cause is also the turn's recorded reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, final

__all__ = ["Cause", "Disposed", "Hook", "Parent", "Timeout", "User", "cause_from_dict"]


@final
@dataclass(frozen=True, slots=True)
class User:
    """A person or CI pressed stop (Ctrl-C, SIGINT, ``/cancel``)."""

    kind: ClassVar[str] = "user"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def describe(self) -> str:
        return "by user"


@final
@dataclass(frozen=True, slots=True)
class Parent:
    """The parent agent of a subagent was cancelled."""

    kind: ClassVar[str] = "parent"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def describe(self) -> str:
        return "by parent agent"


@final
@dataclass(frozen=True, slots=True)
class Hook:
    """A hook (for example a turn budget) cancelled the turn, saying why."""

    reason: str
    kind: ClassVar[str] = "hook"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason}

    def describe(self) -> str:
        return f"by hook: {self.reason}"


@final
@dataclass(frozen=True, slots=True)
class Disposed:
    """The agent is being closed (leaving ``open_agent``, SIGTERM)."""

    kind: ClassVar[str] = "disposed"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def describe(self) -> str:
        return "agent disposed"


@dataclass(frozen=True, slots=True)
class Timeout:
    """A tool call's own timeout elapsed. Only a call's signal sees it (a Python tool's
    ``signal.reason``); a turn is never cancelled with it."""

    after: float
    kind: ClassVar[str] = "timeout"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "after": self.after}

    def describe(self) -> str:
        return f"tool call timed out after {self.after:g}s"


Cause = User | Parent | Hook | Disposed | Timeout


def cause_from_dict(data: object) -> Cause:
    """Parse ``{"kind": ...}`` back into a cause; ``ValueError`` names what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"a cancel cause must be an object, not {type(data).__name__}")
    kind = data.get("kind")
    match kind:
        case "user":
            return User()
        case "parent":
            return Parent()
        case "disposed":
            return Disposed()
        case "hook":
            reason = data.get("reason")
            if not isinstance(reason, str):
                raise ValueError("a hook cause needs a string 'reason'")
            return Hook(reason)
        case "timeout":
            after = data.get("after")
            if isinstance(after, bool) or not isinstance(after, int | float):
                raise ValueError("a timeout cause needs a number 'after'")
            return Timeout(float(after))
        case _:
            raise ValueError(f"unknown cancel cause kind {kind!r}")
