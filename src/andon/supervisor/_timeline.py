"""The grace timeline of one call, as one immutable value replaced at each transition.

``Running`` (its own timeout ahead) → ``Stopping`` (why, the cause, when it began, the stages sent)
→ ``Lost`` (andon gave up on the worker and killed it). "Done" is the outcome itself. A stop is
for the turn's abort, the call's own timeout, or an internal failure of the executor (which then
still stops the call it can no longer follow, by the same ladder). Every deadline comes from
:meth:`GracePolicy.deadline` on the executor's one clock; nothing here sends or sleeps, so the
executor's loop is the only place with effects and a test can drive a timeline by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from andon.base import Cause, GracePolicy, Timeout
from andon.protocol import CANCEL_STAGES, CancelStage
from andon.supervisor._outcome import StageMark

__all__ = ["STAGES", "Lost", "Running", "Stopping", "Timeline", "Why"]

STAGES = CANCEL_STAGES
Why = Literal["abort", "timeout", "internal"]


@dataclass(frozen=True, slots=True)
class Running:
    began: float  # when the run was sent
    timeout: float | None

    def deadline(self) -> float | None:
        """When the call's own timeout starts the stop."""
        if self.timeout is None or not math.isfinite(self.timeout):
            return None
        return self.began + self.timeout

    def stop(self, why: Why, cause: Cause | None, now: float, *, interrupt: bool) -> Stopping:
        """The stop begins; ``interrupt`` False skips the cooperative stage."""
        if why == "timeout" and self.timeout is not None:
            cause = Timeout(self.timeout)  # what a Python tool's signal aborts with
        return Stopping(why=why, cause=cause, began=now, next=0 if interrupt else 1)


@dataclass(frozen=True, slots=True)
class Stopping:
    why: Why
    cause: Cause | None
    began: float
    next: int = 0  # index into STAGES of the next stage to send
    sent: tuple[StageMark, ...] = ()
    kill_sent_at: float | None = None

    def next_stage(self) -> CancelStage | None:
        return STAGES[self.next] if self.next < len(STAGES) else None

    def due(self, now: float, grace: GracePolicy) -> CancelStage | None:
        """The next stage if its deadline has come."""
        stage = self.next_stage()
        if stage is not None and now >= self.began + grace.deadline(stage):
            return stage
        return None

    def send(self, stage: CancelStage, now: float) -> Stopping:
        """``stage`` was sent (stages never go back: an earlier one is a no-op)."""
        index = STAGES.index(stage)
        if index < self.next:
            return self
        return replace(
            self,
            next=index + 1,
            sent=(*self.sent, StageMark(stage, now - self.began)),
            kill_sent_at=now if stage == "kill" else self.kill_sent_at,
        )

    def kill_in(self, now: float, grace: GracePolicy) -> float:
        """Seconds from ``now`` to the KILL stage (what each cancel tells the worker)."""
        return max(0.0, self.began + grace.kill_at - now)

    def deadline(self, grace: GracePolicy, kill_ack_timeout: float) -> float | None:
        """The next moment something is due: a stage, or giving up on an unanswered KILL."""
        stage = self.next_stage()
        if stage is not None:
            at = self.began + grace.deadline(stage)
            return at if math.isfinite(at) else None
        if self.kill_sent_at is not None:
            return self.kill_sent_at + kill_ack_timeout
        return None


@dataclass(frozen=True, slots=True)
class Lost:
    """andon gave up on the worker (it answered an error, never acknowledged a KILL, or could not
    be reached) and killed it; its exit is what ends the call."""

    reason: str
    stop: Stopping | None  # the stop under way when it happened, if any
    at: float  # when andon killed the worker

    def deadline(self, kill_ack_timeout: float) -> float:
        """When waiting for the killed worker's exit ends anyway: the call is answered then, so
        a kill that never shows (the worker could not be signalled) cannot hang it."""
        return self.at + kill_ack_timeout


Timeline = Running | Stopping | Lost
