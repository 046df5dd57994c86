"""The grace ladder of one call: where the call is on it, and the one function that moves it.

A call is ``Running`` (its own timeout ahead), then ``Stopping`` (why, the cause, when the stop
began, the stages sent), then perhaps ``Lost`` (andon gave up on the worker and killed it). "Done"
is the call's result itself, not a state here. :meth:`GraceLadder.step` is the only way from one
value to the next: it takes the value, what happened (an :data:`LadderEvent`) and the time, and
returns the next value with what to do about it (:data:`LadderAction`: send a stage, arm the one
timer, retire the worker, answer the call). It sends nothing and waits for nothing; whoever drives
it does the I/O afterwards, in the order given. Two drivers walk the same ladder, each on its own
clock: the supervisor's executor for every stop it starts, and ``andon worker``'s SIGTERM drain,
which stops its call when no supervisor does (docs/workers.md, The grace policy).

Invariants a driver relies on:

* The value only moves forward: ``Running`` → ``Stopping`` → ``Lost``, or ``Running`` → ``Lost``;
  nothing goes back to ``Running``, and ``Lost`` is final. Within ``Stopping`` the stages only
  advance (:meth:`Stopping.with_sent` of an earlier stage is the same value), so a late tick, a
  force and a timer cannot send a stage twice or out of order.
* A step replaces the whole value, so whoever reads it (a status line, how the call ended) sees
  one consistent state, never a stop half recorded. A stage counts as sent from the step that
  decides it, before the driver's send: if that send fails, the ``Lost`` that follows still
  reports it.
* Every time is a reading of the driver's one clock, and every deadline is computed from the
  value and the call's :class:`GracePolicy`, never stored on its own: a deadline cannot drift from
  the state it belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias, final

from andon.base._causes import Cause, Timeout
from andon.base._grace import GracePolicy
from andon.base._vocabulary import CANCEL_STAGES, CancelStage

__all__ = [
    "AnswerLost",
    "ArmTimer",
    "BeginStop",
    "Force",
    "GraceLadder",
    "LadderAction",
    "LadderEvent",
    "Lost",
    "RetireWorker",
    "Running",
    "SendStage",
    "StageMark",
    "Stopping",
    "Tick",
    "Timeline",
    "Why",
    "WriteOff",
]

Why: TypeAlias = Literal["abort", "timeout", "internal"]
"""What began a stop: the turn's abort (or a worker's own SIGTERM drain), the call's own timeout,
or a failure inside the executor (which still stops the call it can no longer follow)."""


@final
@dataclass(frozen=True, slots=True)
class StageMark:
    """One stage of the grace ladder that was sent, as the status line reports it."""

    stage: str
    """``interrupt``, ``term`` or ``kill``; a call's marks are in ladder order, each one once."""
    since_stop: float
    """Seconds from the stop's beginning to the send, on the executor's clock (the status line's
    ``+2.00s``; ``tool/signal.at`` is the worker's own measure, from the call's start)."""


# -- where the call is ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    """The call runs (or is about to: the run is on its way); nothing has asked it to stop."""

    began: float
    """When the run was sent, on the driver's clock. The call's own timeout counts from here (the
    model has waited since the send, however long the worker takes to spawn the tool)."""
    timeout: float | None
    """The call's own timeout in seconds, chosen before dispatch and fixed for the call's life;
    ``None`` or ``inf``: none, and :meth:`deadline` is ``None``."""

    def deadline(self) -> float | None:
        """When the call's own timeout starts the stop."""
        if self.timeout is None or not math.isfinite(self.timeout):
            return None
        return self.began + self.timeout

    def to_stopping(
        self, why: Why, cause: Cause | None, now: float, *, interrupt: bool
    ) -> Stopping:
        """The value once the stop begins at ``now``; ``interrupt`` False starts at TERM. (Which
        calls skip the interrupt is :meth:`GraceLadder.step`'s to decide.)"""
        if why == "timeout" and self.timeout is not None:
            cause = Timeout(self.timeout)  # what a Python tool's signal aborts with
        return Stopping(why=why, cause=cause, began=now, next=0 if interrupt else 1)


@dataclass(frozen=True, slots=True)
class Stopping:
    """The call is being stopped on the grace ladder; its driver still waits for its result."""

    why: Why
    """What began the stop. Set once, by :meth:`Running.to_stopping`; the one later change is
    ``internal`` → ``abort``, when the turn's cancel lands during a stop that began after a failure
    inside the executor (a cancel wins: the call's result is then ``ABORTED``, its real drained
    outcome). ``abort`` and ``timeout`` never change: a cancel during a timeout's stop leaves it
    a timeout, since the ladder is the same and the call was already timing out."""
    cause: Cause | None
    """What a Python tool's signal aborts with and what the status line names: the turn's cause
    for ``abort``, :class:`Timeout` for ``timeout``, the executor's own hook cause for ``internal``
    (``None`` when nobody gave one: a worker's own drain, whose tool then sees a user's stop)."""
    began: float
    """When the stop began, on the driver's clock. Never moves: every stage is due at ``began +
    grace.deadline(stage)``, and each :class:`StageMark` is measured from here, so a force or a
    late tick cannot shift the ladder."""
    next: int = 0
    """Index into :data:`CANCEL_STAGES` of the next stage to send; only grows. 1 when the stop
    skips the interrupt (a shell call with ``interrupt=False``), 3 once KILL is sent."""
    sent: tuple[StageMark, ...] = ()
    """Every stage sent, in order, with its seconds since :attr:`began`: what the result's status
    line reports. It grows exactly when :attr:`next` does."""
    kill_sent_at: float | None = None
    """When KILL was sent, on the driver's clock; ``None`` before. Set once. From then the worker
    owes the call's end within the ladder's ``kill_ack_timeout``, or it is written off
    (``Lost``)."""

    def next_stage(self) -> CancelStage | None:
        return CANCEL_STAGES[self.next] if self.next < len(CANCEL_STAGES) else None

    def due(self, now: float, grace: GracePolicy) -> CancelStage | None:
        """The next stage if its deadline has come."""
        stage = self.next_stage()
        if stage is not None and now >= self.began + grace.deadline(stage):
            return stage
        return None

    def with_sent(self, stage: CancelStage, now: float) -> Stopping:
        """The value once ``stage`` is sent at ``now`` (stages never go back: an earlier one
        gives this same value)."""
        index = CANCEL_STAGES.index(stage)
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

    def deadline(self, grace: GracePolicy, kill_ack_timeout: float | None) -> float | None:
        """The next moment something is due: a stage, or giving up on an unanswered KILL
        (never, with no ``kill_ack_timeout``)."""
        stage = self.next_stage()
        if stage is not None:
            at = self.began + grace.deadline(stage)
            return at if math.isfinite(at) else None
        if self.kill_sent_at is not None and kill_ack_timeout is not None:
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
    """When andon killed the worker, on the driver's clock. The pool's report of the worker's
    exit normally answers the call first; :meth:`deadline` bounds the wait if it never comes."""

    def deadline(self, kill_ack_timeout: float) -> float:
        """When waiting for the killed worker's exit ends anyway: the call is answered then, so
        a kill that never shows (the worker could not be signalled) cannot hang it."""
        return self.at + kill_ack_timeout


Timeline: TypeAlias = Running | Stopping | Lost


# -- what happens to it -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (a timer fired). It names no deadline: the step does what is due at ``now``,
    so a tick from a timer that was replaced, or two in a row, do nothing wrong."""


@dataclass(frozen=True, slots=True)
class BeginStop:
    """Stop the call: the turn's abort, a worker's drain, or a failure inside the executor. A
    call's own timeout needs no event: a :class:`Tick` past it begins the stop."""

    why: Literal["abort", "internal"]
    cause: Cause | None


@dataclass(frozen=True, slots=True)
class Force:
    """Skip the rest of the grace period (a second Ctrl-C): every stage left, now."""


@dataclass(frozen=True, slots=True)
class WriteOff:
    """The worker cannot be trusted with the call any more (it answered an error, a message to it
    could not be sent, the timer could not be armed): kill it, and wait for its exit."""

    reason: str


LadderEvent: TypeAlias = Tick | BeginStop | Force | WriteOff


# -- what the driver does about it ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendStage:
    """Send the worker this stage of the ladder, with the stop's cause and how far off KILL is
    (``kill_in``, seconds; ``inf`` when KILL never comes), so its sweep never waits past it."""

    stage: CancelStage
    kill_in: float
    cause: Cause | None


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """Arm the one timer for ``at`` on the driver's clock, replacing any armed before; ``None``:
    nothing is due until something else happens, so no timer."""

    at: float | None


@dataclass(frozen=True, slots=True)
class RetireWorker:
    """Kill the worker with the call's processes; its exit answers the call."""

    reason: str


@dataclass(frozen=True, slots=True)
class AnswerLost:
    """The killed worker never showed its exit: answer the call as lost now, with ``reason``."""

    reason: str


LadderAction: TypeAlias = SendStage | ArmTimer | RetireWorker | AnswerLost


# -- the one transition -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GraceLadder:
    """The ladder a call is stopped by, fixed for its life, and :meth:`step`, which walks it."""

    grace: GracePolicy
    python: bool = False
    """A Python tool: its first stage is its cooperative signal, whatever ``grace.interrupt``
    says of SIGINT (it is no signal and harms nothing)."""
    kill_ack_timeout: float | None = None
    """How long the worker may leave a KILL unanswered before it is written off (``Lost``), and
    how long the killed worker's exit is then waited for. ``None``: never (a worker's own drain,
    which waits for its call whatever happens)."""

    def step(
        self, timeline: Timeline, event: LadderEvent, now: float
    ) -> tuple[Timeline, tuple[LadderAction, ...]]:
        """The value after ``event`` at ``now``, and what to do about it, in order.

        Every edge of the ladder is named here, once. A step that may move the next deadline
        ends with :class:`ArmTimer` (a :class:`Tick` and a :class:`Force` always do); a step
        that changes nothing returns no action.
        """
        match timeline, event:
            # Running --------------------------------------------------------------------------
            case Running(), Tick():
                deadline = timeline.deadline()
                if deadline is not None and now >= deadline:
                    return self._begin(timeline, "timeout", None, now)  # its own timeout
                return timeline, (self._arm(timeline),)
            case Running(), BeginStop(why=why, cause=cause):
                return self._begin(timeline, why, cause, now)
            case Running(), Force():
                return timeline, (self._arm(timeline),)  # nothing to hurry yet
            case Running(), WriteOff(reason=reason):
                return self._lose(reason, None, now)
            # Stopping -------------------------------------------------------------------------
            case Stopping(), Tick():
                after, sends = self._send_due(timeline, now)
                if (
                    after.kill_sent_at is not None
                    and self.kill_ack_timeout is not None
                    and now >= after.kill_sent_at + self.kill_ack_timeout
                ):
                    lost, actions = self._lose(
                        f"the worker did not report the call's end within "
                        f"{self.kill_ack_timeout:g}s of SIGKILL",
                        after,
                        now,
                    )
                    return lost, (*sends, *actions)
                return after, (*sends, self._arm(after))
            case Stopping(why="internal"), BeginStop(why="abort", cause=cause):
                # A cancel wins: the stop under way after a failure is now the turn's.
                return replace(timeline, why="abort", cause=cause), ()
            case Stopping(), BeginStop():
                return timeline, ()  # a second reason to stop never restarts the ladder
            case Stopping(), Force():
                after, sends = self._send_rest(timeline, now)
                return after, (*sends, self._arm(after))
            case Stopping(), WriteOff(reason=reason):
                return self._lose(reason, timeline, now)
            # Lost: final; only its own deadline answers the call ----------------------------
            case Lost(), Tick():
                if self.kill_ack_timeout is not None and now >= timeline.deadline(
                    self.kill_ack_timeout
                ):
                    # The killed worker never showed its exit (it could not be signalled?).
                    return timeline, (
                        AnswerLost(
                            f"{timeline.reason}; it did not exit within "
                            f"{self.kill_ack_timeout:g}s of being killed"
                        ),
                    )
                return timeline, (self._arm(timeline),)
            case Lost(), Force():
                return timeline, (self._arm(timeline),)
            case Lost(), BeginStop() | WriteOff():
                return timeline, ()  # the worker is being killed; the first reason stays
        raise AssertionError(f"no edge for {event!r} in {type(timeline).__name__}")

    # -- the pieces of the edges above ------------------------------------------------------

    def _begin(
        self, running: Running, why: Why, cause: Cause | None, now: float
    ) -> tuple[Timeline, tuple[LadderAction, ...]]:
        # The one rule for skipping the interrupt: a shell call whose policy says so starts at
        # TERM; a Python tool's first stage is its signal, whatever ``interrupt`` says of SIGINT.
        stopping = running.to_stopping(
            why, cause, now, interrupt=self.grace.interrupt or self.python
        )
        # The first stage is due at once (0 s): decided in this same step, not one tick later,
        # so a cancel reaches the worker with no timer in between.
        after, sends = self._send_due(stopping, now)
        return after, (*sends, self._arm(after))

    def _send_due(self, stopping: Stopping, now: float) -> tuple[Stopping, tuple[SendStage, ...]]:
        return self._send_each(stopping, now, lambda s: s.due(now, self.grace))

    def _send_rest(self, stopping: Stopping, now: float) -> tuple[Stopping, tuple[SendStage, ...]]:
        # Every stage left, in order (none skipped), each at its own ``kill_in``.
        return self._send_each(stopping, now, Stopping.next_stage)

    def _send_each(
        self, stopping: Stopping, now: float, pick: Callable[[Stopping], CancelStage | None]
    ) -> tuple[Stopping, tuple[SendStage, ...]]:
        """Send the stages ``pick`` names, one after another, until it names none."""
        sends: list[SendStage] = []
        while (stage := pick(stopping)) is not None:
            stopping = stopping.with_sent(stage, now)
            sends.append(self._send(stopping, stage, now))
        return stopping, tuple(sends)

    def _send(self, stopping: Stopping, stage: CancelStage, now: float) -> SendStage:
        return SendStage(stage, stopping.kill_in(now, self.grace), stopping.cause)

    def _lose(
        self, reason: str, stop: Stopping | None, now: float
    ) -> tuple[Timeline, tuple[LadderAction, ...]]:
        # From here no stage is sent: the worker is not trusted to apply one.
        lost = Lost(reason, stop, now)
        return lost, (RetireWorker(reason), self._arm(lost))

    def _arm(self, timeline: Timeline) -> ArmTimer:
        """The one timer, for the value's next deadline (none when it is never)."""
        at: float | None
        if isinstance(timeline, Running):
            at = timeline.deadline()
        elif isinstance(timeline, Stopping):
            at = timeline.deadline(self.grace, self.kill_ack_timeout)
        elif self.kill_ack_timeout is not None:
            at = timeline.deadline(self.kill_ack_timeout)
        else:
            at = None
        return ArmTimer(at if at is not None and math.isfinite(at) else None)
