"""The grace policy value (docs/workers.md, The grace policy).

It lives in ``base`` because three layers share it: the wire (``run`` carries it), the worker
(sweep bounds, and ``andon worker``'s own SIGTERM drain) and the supervisor's executor (which
walks the grace ladder, :mod:`andon.base._ladder`, for every stop it starts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, final

from andon.base._vocabulary import CancelStage

__all__ = ["GracePolicy"]


@final
@dataclass(frozen=True, slots=True)
class GracePolicy:
    """How a started tool call is stopped.

    At 0: cooperative (Python tools see their signal; shell tools get SIGINT on their group unless
    ``interrupt`` is False). At ``term_after``: SIGTERM. At ``term_after + kill_after``: SIGKILL.
    ``term_after=inf`` is purely cooperative; ``0, 0`` is an immediate SIGKILL.
    """

    interrupt: bool = True
    """Whether a shell call gets SIGINT at 0. A Python tool's signal aborts at 0 either way: its
    cooperative stop is not a signal and harms nothing."""
    term_after: float = 2.0
    """Seconds from the stop's beginning to SIGTERM; ``>= 0``, ``inf`` for never (then KILL never
    comes either, and only the tool or a force ends the call)."""
    kill_after: float = 3.0
    """Seconds from SIGTERM to SIGKILL; ``>= 0``. Also the longest the worker's sweep of leftovers
    waits between its SIGTERM and SIGKILL (never past the ladder's own KILL)."""

    def __post_init__(self) -> None:
        for name in ("term_after", "kill_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"GracePolicy.{name} must be a number of seconds")
            if math.isnan(value) or value < 0:
                raise ValueError(f"GracePolicy.{name} must be >= 0 seconds (got {value})")

    @property
    def kill_at(self) -> float:
        """Seconds after the stop began at which SIGKILL is sent."""
        return self.term_after + self.kill_after

    def deadline(self, stage: CancelStage) -> float:
        """Seconds after the stop began at which ``stage`` is sent. The grace ladder
        (:class:`~andon.base.GraceLadder`) takes every deadline from here, for the executor and
        the worker's SIGTERM drain alike."""
        match stage:
            case "interrupt":
                return 0.0
            case "term":
                return self.term_after
            case "kill":
                return self.kill_at
        raise ValueError(f"unknown grace stage {stage!r}")

    @classmethod
    def parse(cls, text: str) -> GracePolicy:
        """Parse ``"TERM,KILL"`` as given to ``--grace`` (``inf`` allowed)."""
        parts = text.split(",")
        if len(parts) != 2:
            raise ValueError(f"--grace takes TERM,KILL in seconds, e.g. 2,3 (got {text!r})")
        # One plain line per mistake, naming the flag and the rule (never this class's field
        # names): the CLI prints the message as it is.
        stages: list[float] = []
        for label, part in zip(("TERM", "KILL"), parts, strict=True):
            try:
                value = float(part)
            except ValueError:
                raise ValueError(
                    f"--grace: {label} must be a number of seconds (got {part.strip()!r})"
                ) from None
            if math.isnan(value) or value < 0:
                raise ValueError(
                    f"--grace: {label} must be a number of seconds >= 0 (got {part.strip()})"
                )
            stages.append(value)
        term, kill = stages
        return cls(term_after=term, kill_after=kill)

    def to_dict(self) -> dict[str, Any]:
        return {
            "interrupt": self.interrupt,
            "term_after": self.term_after,
            "kill_after": self.kill_after,
        }
