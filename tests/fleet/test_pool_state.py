"""The pool's lifecycle value: each step is a new value, and the reason the pool takes no more work
is the first one given (docs/workers.md, The pool's life)."""

from __future__ import annotations

import pytest

from andon.fleet._pool_state import POOL_CLOSED, Phase, PoolState


def test_a_pool_is_new_then_starting_then_open() -> None:
    state = PoolState()
    assert state.phase is Phase.NEW and state.stopped is None and not state.closes
    assert PoolState(Phase.STARTING).opened() == PoolState(Phase.OPEN)


def test_the_first_reason_to_stop_taking_work_stays_through_the_close() -> None:
    stopped = PoolState(Phase.OPEN).stop("no tool worker could be started").stop("later")
    assert stopped == PoolState(Phase.STOPPED, "no tool worker could be started")
    assert stopped.opened() is stopped  # a start that returns does not reopen it
    closing = stopped.closing()
    assert closing.phase is Phase.CLOSING and closing.closes
    assert closing.stopped == "no tool worker could be started"
    assert closing.stop("another") is closing
    assert closing.closed() == PoolState(Phase.CLOSED, "no tool worker could be started")


def test_a_close_without_an_earlier_reason_says_the_pool_was_closed() -> None:
    for phase in (Phase.NEW, Phase.STARTING, Phase.OPEN):
        assert PoolState(phase).closing() == PoolState(Phase.CLOSING, POOL_CLOSED)
    assert PoolState(Phase.STARTING).closing().opened().phase is Phase.CLOSING


@pytest.mark.parametrize(
    ("phase", "stopped"),
    [(Phase.OPEN, "a reason"), (Phase.STOPPED, None), (Phase.CLOSED, None)],
)
def test_a_reason_comes_with_a_phase_that_takes_no_work_and_only_then(
    phase: Phase, stopped: str | None
) -> None:
    with pytest.raises(AssertionError):
        PoolState(phase, stopped)
