"""What a worker knows of its call's stop: one frozen value, replaced on each cancel."""

from __future__ import annotations

import dataclasses
import math

import pytest

from andon.base import Timeout, User
from andon.protocol import Cancel
from andon.workers._calls import CallStop


def cancel(stage: str, kill_in: float = math.inf, cause: object = None) -> Cancel:
    return Cancel(call_id="c1-1-1", stage=stage, kill_in=kill_in, cause=cause)  # type: ignore[arg-type]


def test_the_kill_deadline_only_moves_earlier_and_the_first_cause_stays() -> None:
    stop = CallStop()
    stop = stop.with_cancel(cancel("interrupt", 5.0, Timeout(10.0).to_dict()), now=100.0)
    assert (stop.kill_deadline, stop.cause) == (105.0, Timeout(10.0))
    stop = stop.with_cancel(cancel("term", 1.0, User().to_dict()), now=101.0)
    assert (stop.kill_deadline, stop.cause) == (102.0, Timeout(10.0))
    stop = stop.with_cancel(cancel("kill", 9.0), now=101.5)  # later: the earlier deadline holds
    assert stop.kill_deadline == 102.0
    assert CallStop().with_cancel(cancel("interrupt"), now=1.0).kill_deadline is None  # inf


def test_stages_applied_and_requested_only_grow() -> None:
    stop = CallStop().with_applied("term").with_applied("interrupt")
    assert stop.last_stage == "term"
    assert stop.with_applied("kill").last_stage == "kill"
    held = CallStop().with_requested("kill").with_requested("interrupt")
    assert held.requested == "kill" and held.last_stage is None


def test_the_value_is_replaced_never_changed() -> None:
    stop = CallStop()
    assert stop.with_applied("term") is not stop and stop.last_stage is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        stop.last_stage = "kill"  # type: ignore[misc]
