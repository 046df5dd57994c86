"""The grace timeline as a value: every deadline from GracePolicy.deadline, stages only forward."""

from __future__ import annotations

import math

import pytest

from andon.base import GracePolicy, Running, Stopping, Timeout, User

GRACE = GracePolicy(term_after=2.0, kill_after=3.0)


def test_policy_deadlines_are_computed_in_one_place() -> None:
    assert [GRACE.deadline(s) for s in ("interrupt", "term", "kill")] == [0.0, 2.0, 5.0]
    with pytest.raises(ValueError, match="sweep"):
        GRACE.deadline("sweep")  # type: ignore[arg-type]


def test_a_running_call_stops_at_its_timeout_with_the_timeout_as_cause() -> None:
    running = Running(began=100.0, timeout=10.0)
    assert running.deadline() == 110.0
    assert Running(100.0, None).deadline() is None
    assert Running(100.0, math.inf).deadline() is None
    stop = running.to_stopping("timeout", None, 110.0, interrupt=True)
    assert stop.cause == Timeout(10.0)
    assert stop.next_stage() == "interrupt"
    assert running.to_stopping("abort", User(), 105.0, interrupt=True).cause == User()


def test_stages_are_due_at_their_deadlines_and_never_go_back() -> None:
    stop = Stopping(why="abort", cause=User(), began=10.0)
    assert stop.due(10.0, GRACE) == "interrupt"
    stop = stop.with_sent("interrupt", 10.0)
    assert stop.due(11.9, GRACE) is None
    assert stop.deadline(GRACE, kill_ack_timeout=10.0) == 12.0
    assert stop.due(12.0, GRACE) == "term"
    stop = stop.with_sent("kill", 12.5)  # force: straight to KILL
    assert stop.next_stage() is None
    assert stop.with_sent("term", 13.0) is stop  # an earlier stage after a later one: nothing
    assert [(m.stage, m.since_stop) for m in stop.sent] == [("interrupt", 0.0), ("kill", 2.5)]
    assert stop.kill_sent_at == 12.5
    assert stop.deadline(GRACE, kill_ack_timeout=10.0) == 22.5  # giving up on the worker


def test_no_interrupt_starts_at_term_and_kill_in_counts_down() -> None:
    stop = Running(0.0, None).to_stopping("abort", User(), 50.0, interrupt=False)
    assert stop.next_stage() == "term"
    assert stop.kill_in(51.0, GRACE) == 4.0
    assert stop.kill_in(60.0, GRACE) == 0.0
    cooperative = GracePolicy(term_after=math.inf, kill_after=1.0)
    assert Stopping("abort", User(), 0.0, next=1).deadline(cooperative, 10.0) is None
