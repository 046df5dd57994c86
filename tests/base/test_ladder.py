"""The grace ladder's one transition, edge by edge (docs/workers.md, The grace policy).

``GraceLadder.step`` is a pure function of (value, event, now): these tests call it with numbers,
no clock, no process, no worker, and read back the value and the actions it returns.
"""

from __future__ import annotations

import itertools
import math

import pytest

from andon.base import (
    AnswerLost,
    ArmTimer,
    BeginStop,
    Force,
    GraceLadder,
    GracePolicy,
    Hook,
    LadderAction,
    LadderEvent,
    Lost,
    RetireWorker,
    Running,
    SendStage,
    StageMark,
    Stopping,
    Tick,
    Timeline,
    Timeout,
    User,
    WriteOff,
)

GRACE = GracePolicy(term_after=2.0, kill_after=3.0)
SHELL = GraceLadder(GRACE, kill_ack_timeout=10.0)
INTERNAL = Hook("internal error in andon")


def sends(actions: tuple[LadderAction, ...]) -> list[tuple[str, float]]:
    return [(a.stage, a.kill_in) for a in actions if isinstance(a, SendStage)]


def stopping_at(began: float, *stages: str, ladder: GraceLadder = SHELL) -> Stopping:
    """A stop begun at ``began`` with the interrupt sent, then each of ``stages`` sent on time."""
    timeline, _ = ladder.step(Running(0.0, None), BeginStop("abort", User()), began)
    for stage in stages:
        timeline, _ = ladder.step(timeline, Tick(), began + GRACE.deadline(stage))  # type: ignore[arg-type]
    assert isinstance(timeline, Stopping)
    return timeline


# -- Running ------------------------------------------------------------------------------------


def test_a_tick_before_the_timeout_only_rearms_the_timer() -> None:
    running = Running(began=100.0, timeout=10.0)
    assert SHELL.step(running, Tick(), 109.9) == (running, (ArmTimer(110.0),))
    no_timeout = Running(100.0, None)
    assert SHELL.step(no_timeout, Tick(), 1e9) == (no_timeout, (ArmTimer(None),))
    assert SHELL.step(Running(100.0, math.inf), Tick(), 1e9)[1] == (ArmTimer(None),)


def test_a_tick_at_the_timeout_begins_the_stop_and_sends_the_interrupt_in_the_same_step() -> None:
    after, actions = SHELL.step(Running(100.0, 10.0), Tick(), 110.0)
    assert after == Stopping(
        why="timeout",
        cause=Timeout(10.0),
        began=110.0,
        next=1,
        sent=(StageMark("interrupt", 0.0),),
    )
    assert actions == (SendStage("interrupt", 5.0, Timeout(10.0)), ArmTimer(112.0))


def test_an_abort_begins_the_stop_with_its_cause() -> None:
    after, actions = SHELL.step(Running(0.0, 30.0), BeginStop("abort", User()), 7.0)
    assert isinstance(after, Stopping)
    assert (after.why, after.cause, after.began) == ("abort", User(), 7.0)
    assert actions == (SendStage("interrupt", 5.0, User()), ArmTimer(9.0))


def test_an_internal_failure_begins_the_same_ladder() -> None:
    after, actions = SHELL.step(Running(0.0, None), BeginStop("internal", INTERNAL), 1.0)
    assert isinstance(after, Stopping) and after.why == "internal" and after.cause == INTERNAL
    assert sends(actions) == [("interrupt", 5.0)]


def test_a_shell_call_without_interrupt_starts_at_term() -> None:
    ladder = GraceLadder(GracePolicy(interrupt=False, term_after=2.0, kill_after=3.0))
    after, actions = ladder.step(Running(0.0, None), BeginStop("abort", User()), 0.0)
    assert isinstance(after, Stopping) and after.next_stage() == "term"
    assert actions == (ArmTimer(2.0),)  # nothing sent at 0
    after, actions = ladder.step(after, Tick(), 2.0)
    assert sends(actions) == [("term", 3.0)]


def test_a_python_tool_gets_its_signal_at_once_whatever_interrupt_says() -> None:
    ladder = GraceLadder(GracePolicy(interrupt=False, term_after=2.0, kill_after=3.0), python=True)
    _, actions = ladder.step(Running(0.0, None), BeginStop("abort", User()), 0.0)
    assert sends(actions) == [("interrupt", 5.0)]


def test_a_zero_grace_sends_every_stage_in_the_first_step() -> None:
    ladder = GraceLadder(GracePolicy(term_after=0.0, kill_after=0.0), kill_ack_timeout=10.0)
    after, actions = ladder.step(Running(0.0, None), BeginStop("abort", User()), 4.0)
    assert sends(actions) == [("interrupt", 0.0), ("term", 0.0), ("kill", 0.0)]
    assert isinstance(after, Stopping) and after.kill_sent_at == 4.0
    assert actions[-1] == ArmTimer(14.0)  # the wait for the KILL's answer


def test_a_force_before_any_stop_changes_nothing() -> None:
    running = Running(0.0, 30.0)
    assert SHELL.step(running, Force(), 5.0) == (running, (ArmTimer(30.0),))


def test_giving_up_on_a_running_call_retires_its_worker() -> None:
    after, actions = SHELL.step(Running(0.0, 30.0), WriteOff("the worker answered an error"), 3.0)
    assert after == Lost("the worker answered an error", None, 3.0)
    assert actions == (RetireWorker("the worker answered an error"), ArmTimer(13.0))


# -- Stopping -----------------------------------------------------------------------------------


def test_a_tick_sends_each_stage_at_its_deadline_and_no_earlier() -> None:
    stop = stopping_at(10.0)
    assert SHELL.step(stop, Tick(), 11.9) == (stop, (ArmTimer(12.0),))
    after, actions = SHELL.step(stop, Tick(), 12.0)
    assert actions == (SendStage("term", 3.0, User()), ArmTimer(15.0))
    after, actions = SHELL.step(after, Tick(), 15.0)
    assert actions == (SendStage("kill", 0.0, User()), ArmTimer(25.0))
    assert isinstance(after, Stopping)
    assert [(m.stage, m.since_stop) for m in after.sent] == [
        ("interrupt", 0.0),
        ("term", 2.0),
        ("kill", 5.0),
    ]


def test_a_late_tick_sends_every_stage_due_in_order() -> None:
    _, actions = SHELL.step(stopping_at(10.0), Tick(), 16.0)
    assert sends(actions) == [("term", 0.0), ("kill", 0.0)]


def test_a_kill_left_unanswered_gives_up_on_the_worker() -> None:
    stop = stopping_at(10.0, "term", "kill")
    assert SHELL.step(stop, Tick(), 24.9) == (stop, (ArmTimer(25.0),))
    after, actions = SHELL.step(stop, Tick(), 25.0)
    reason = "the worker did not report the call's end within 10s of SIGKILL"
    assert after == Lost(reason, stop, 25.0)
    assert actions == (RetireWorker(reason), ArmTimer(35.0))


def test_a_cancel_wins_over_a_stop_after_an_internal_failure() -> None:
    after, _ = SHELL.step(Running(0.0, None), BeginStop("internal", INTERNAL), 1.0)
    assert isinstance(after, Stopping)
    cancelled, actions = SHELL.step(after, BeginStop("abort", User()), 1.5)
    assert actions == ()
    assert isinstance(cancelled, Stopping) and (cancelled.why, cancelled.cause) == ("abort", User())
    assert cancelled.began == 1.0 and cancelled.sent == after.sent  # the ladder goes on
    # Later stages carry the turn's cause.
    assert SHELL.step(cancelled, Tick(), 3.0)[1][0] == SendStage("term", 3.0, User())


@pytest.mark.parametrize(
    ("why", "event"),
    [
        ("abort", BeginStop("abort", Hook("again"))),
        ("abort", BeginStop("internal", INTERNAL)),
        ("timeout", BeginStop("abort", User())),
        ("internal", BeginStop("internal", INTERNAL)),
    ],
)
def test_a_second_reason_to_stop_never_restarts_the_ladder(why: str, event: BeginStop) -> None:
    stop = Stopping(why=why, cause=User(), began=10.0, next=1)  # type: ignore[arg-type]
    assert SHELL.step(stop, event, 11.0) == (stop, ())


def test_a_force_sends_every_stage_left_now() -> None:
    after, actions = SHELL.step(stopping_at(10.0), Force(), 11.0)
    assert actions == (
        SendStage("term", 4.0, User()),
        SendStage("kill", 4.0, User()),
        ArmTimer(21.0),
    )
    assert isinstance(after, Stopping) and after.kill_sent_at == 11.0
    # A second force, and a tick from the timer it replaced, send nothing more.
    assert sends(SHELL.step(after, Force(), 11.5)[1]) == []
    assert sends(SHELL.step(after, Tick(), 12.0)[1]) == []


def test_giving_up_during_a_stop_keeps_the_stop() -> None:
    stop = stopping_at(10.0, "term")
    after, actions = SHELL.step(stop, WriteOff("andon could not send it a 'cancel' message"), 13.0)
    assert after == Lost("andon could not send it a 'cancel' message", stop, 13.0)
    assert actions == (RetireWorker("andon could not send it a 'cancel' message"), ArmTimer(23.0))


# -- Lost ---------------------------------------------------------------------------------------


def test_a_lost_worker_that_never_exits_is_answered_at_its_deadline() -> None:
    lost = Lost("the worker answered an error", None, 50.0)
    assert SHELL.step(lost, Tick(), 59.0) == (lost, (ArmTimer(60.0),))
    reason = "the worker answered an error; it did not exit within 10s of being killed"
    assert SHELL.step(lost, Tick(), 60.0) == (lost, (AnswerLost(reason),))


@pytest.mark.parametrize("event", [BeginStop("abort", User()), WriteOff("a second reason")])
def test_lost_is_final_and_keeps_its_first_reason(event: LadderEvent) -> None:
    lost = Lost("the first reason", None, 50.0)
    assert SHELL.step(lost, event, 51.0) == (lost, ())
    assert SHELL.step(lost, Force(), 51.0) == (lost, (ArmTimer(60.0),))


# -- the worker's own drain: no supervisor gives up on it ---------------------------------------


def test_a_drain_waits_for_its_call_after_kill_whatever_the_time() -> None:
    drain = GraceLadder(GRACE)  # no kill_ack_timeout
    stop = stopping_at(0.0, "term", "kill", ladder=drain)
    assert drain.step(stop, Tick(), 1e9) == (stop, (ArmTimer(None),))


def test_a_purely_cooperative_ladder_arms_no_timer_after_the_interrupt() -> None:
    ladder = GraceLadder(GracePolicy(term_after=math.inf, kill_after=1.0), kill_ack_timeout=10.0)
    _, actions = ladder.step(Running(0.0, None), BeginStop("abort", User()), 0.0)
    assert actions == (SendStage("interrupt", math.inf, User()), ArmTimer(None))


# -- the whole table ----------------------------------------------------------------------------

STATES: list[Timeline] = [
    Running(0.0, 5.0),
    Running(0.0, None),
    Stopping("abort", User(), 0.0),
    Stopping("internal", INTERNAL, 0.0, next=1),
    Stopping("timeout", Timeout(5.0), 0.0, next=3, kill_sent_at=5.0),
    Lost("gone", None, 0.0),
]
EVENTS: list[LadderEvent] = [
    Tick(),
    BeginStop("abort", User()),
    BeginStop("internal", INTERNAL),
    Force(),
    WriteOff("gone"),
]


@pytest.mark.parametrize(("timeline", "event"), list(itertools.product(STATES, EVENTS)))
@pytest.mark.parametrize("now", [0.0, 3.0, 100.0])
def test_every_state_has_an_edge_for_every_event_and_only_moves_forward(
    timeline: Timeline, event: LadderEvent, now: float
) -> None:
    order = {Running: 0, Stopping: 1, Lost: 2}
    after, actions = SHELL.step(timeline, event, now)
    assert SHELL.step(timeline, event, now) == (after, actions)  # a function of its inputs
    assert order[type(after)] >= order[type(timeline)]
    if isinstance(timeline, Stopping) and isinstance(after, Stopping):
        assert after.next >= timeline.next and after.began == timeline.began
    arms = [a for a in actions if isinstance(a, ArmTimer)]
    assert len(arms) <= 1 and (not arms or actions[-1] is arms[0])  # one timer, armed last
    if isinstance(event, Tick | Force) and not any(isinstance(a, AnswerLost) for a in actions):
        assert arms  # a tick or a force always re-arms the timer
    for armed in arms:
        assert armed.at is None or math.isfinite(armed.at)
