"""The grace timeline of one call, as one immutable value replaced at each transition.

``Running`` (its own timeout ahead) → ``Stopping`` (why, the cause, when it began, the stages sent)
→ ``Lost`` (andon gave up on the worker and killed it). "Done" is the outcome itself. A stop is
for the turn's abort, the call's own timeout, or an internal failure of the executor (which then
still stops the call it can no longer follow, by the same ladder). Every deadline comes from
:meth:`GracePolicy.deadline` on the executor's one clock; nothing here sends or sleeps, so the
executor's loop is the only place with effects and a test can drive a timeline by hand.

Invariants the executor relies on:

* The value only moves forward: ``Running`` → ``Stopping`` → ``Lost``, or ``Running`` → ``Lost``;
  nothing ever goes back to ``Running``, and ``Lost`` is final. Within ``Stopping`` the stages
  only advance (:meth:`Stopping.send` of an earlier stage is a no-op), so a late tick, a force and
  a timer cannot send a stage twice or out of order.
* A transition replaces the whole value, so whoever reads the timeline (the status line, how the
  call ended) sees one consistent state, never a stop half recorded.
* Every time is a reading of the executor's one clock, and every deadline is computed from the
  fields here and the call's :class:`GracePolicy`, never stored on its own: a deadline cannot
  drift from the state it belongs to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from andon.base import CANCEL_STAGES, CancelStage, Cause, GracePolicy, Timeout
from andon.supervisor._outcome import StageMark

__all__ = ["STAGES", "Lost", "Running", "Stopping", "Timeline", "Why"]

STAGES = CANCEL_STAGES
Why = Literal["abort", "timeout", "internal"]


@dataclass(frozen=True, slots=True)
class Running:
    """The call runs (or is about to: the run is on its way); nothing has asked it to stop."""

    began: float
    """When the run was sent, on the executor's clock. The call's own timeout counts from here (the
    model has waited since the send, however long the worker takes to spawn the tool)."""
    timeout: float | None
    """The call's own timeout in seconds, chosen before dispatch and fixed for the call's life;
    ``None`` or ``inf``: none, and :meth:`deadline` is ``None``."""

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
    """The call is being stopped on the grace ladder; the executor still waits for its result."""

    why: Why
    """What began the stop. Set once, by :meth:`Running.stop`; the one later change is
    ``internal`` → ``abort``, when the turn's cancel lands during a stop that began after a failure
    inside the executor (a cancel wins: the call's result is then ``ABORTED``, its real drained
    outcome). ``abort`` and ``timeout`` never change: a cancel during a timeout's stop leaves it
    a timeout, since the ladder is the same and the call was already timing out."""
    cause: Cause | None
    """What a Python tool's signal aborts with and what the status line names: the turn's cause
    for ``abort``, :class:`Timeout` for ``timeout``, the executor's own hook cause for ``internal``
    (``None`` only in type: an aborted signal always has its reason)."""
    began: float
    """When the stop began, on the executor's clock. Never moves: every stage is due at ``began +
    grace.deadline(stage)``, and each :class:`StageMark` is measured from here, so a force or a
    late tick cannot shift the ladder."""
    next: int = 0
    """Index into :data:`STAGES` of the next stage to send; only grows. 1 when the stop skips the
    interrupt (a shell call with ``interrupt=False``), ``len(STAGES)`` once KILL is sent."""
    sent: tuple[StageMark, ...] = ()
    """Every stage sent, in order, with its seconds since :attr:`began`: what the result's status
    line reports. It grows exactly when :attr:`next` does."""
    kill_sent_at: float | None = None
    """When KILL was sent, on the executor's clock; ``None`` before. Set once. From then the worker
    owes the call's end within the executor's ``kill_ack_timeout``, or it is written off
    (``Lost``)."""

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
    """Why andon gave up on the worker; the call's ``WORKER_LOST`` message says it."""
    stop: Stopping | None
    """The stop under way when it happened, if any, kept whole: the result still reports the
    stages sent and why the call was being stopped."""
    at: float
    """When andon killed the worker, on the executor's clock. The pool's report of the worker's
    exit normally answers the call first; :meth:`deadline` bounds the wait if it never comes."""

    def deadline(self, kill_ack_timeout: float) -> float:
        """When waiting for the killed worker's exit ends anyway: the call is answered then, so
        a kill that never shows (the worker could not be signalled) cannot hang it."""
        return self.at + kill_ack_timeout


Timeline = Running | Stopping | Lost
