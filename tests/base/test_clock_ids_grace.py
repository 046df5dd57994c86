from __future__ import annotations

import asyncio
import math

import pytest

from andon.base import (
    GracePolicy,
    ManualClock,
    SystemClock,
    call_id,
    is_call_id,
    is_message_id,
    message_id,
    parse_call_id,
    session_id,
)


async def test_manual_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = ManualClock()
    woke: list[str] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("late", 5)), asyncio.create_task(sleeper("early", 2))]
    await clock.wait_for_sleepers(2)
    clock.advance(1.9)
    await asyncio.sleep(0)  # sleep-ok: give woken tasks a tick (none should wake)
    assert woke == []
    clock.advance(0.2)
    await tasks[1]
    assert woke == ["early"]
    clock.advance(10)
    await tasks[0]
    assert woke == ["early", "late"]
    assert clock.monotonic() == pytest.approx(1012.1)


async def test_manual_clock_never_goes_backwards() -> None:
    with pytest.raises(ValueError, match="backwards"):
        ManualClock().advance(-1)


async def test_manual_clock_timers_fire_in_order_on_the_loop_and_cancel() -> None:
    clock = ManualClock()
    fired: list[str] = []
    done = asyncio.Event()
    clock.call_at(clock.monotonic() + 3, lambda: fired.append("b"))
    clock.call_at(clock.monotonic() + 1, lambda: fired.append("a"))
    gone = clock.call_at(clock.monotonic() + 2, lambda: fired.append("cancelled"))
    never = clock.call_at(math.inf, lambda: fired.append("never"))
    assert clock.sleepers == 4
    gone.cancel()
    assert clock.sleepers == 3
    clock.call_at(clock.monotonic() + 3, done.set)
    clock.advance(5)
    assert fired == []  # timers run on the loop, never inside advance()
    await done.wait()
    assert fired == ["a", "b"]
    assert clock.sleepers == 1  # the infinite one
    never.cancel()
    assert clock.sleepers == 0
    past = asyncio.Event()
    clock.call_at(clock.monotonic() - 1, past.set)  # already due: runs at the next loop turn
    assert not past.is_set()
    await past.wait()


async def test_manual_clock_counts_timers_as_sleepers() -> None:
    clock = ManualClock()
    fired = asyncio.Event()
    waiter = asyncio.create_task(clock.wait_for_sleepers(1))
    clock.call_at(clock.monotonic() + 1, fired.set)
    await waiter
    clock.advance(1)
    await fired.wait()


async def test_system_clock_call_at_fires_and_cancels() -> None:
    clock = SystemClock()
    fired = asyncio.Event()
    cancelled: list[int] = []
    clock.call_at(clock.monotonic() - 1, fired.set)
    timer = clock.call_at(clock.monotonic(), lambda: cancelled.append(1))
    timer.cancel()
    clock.call_at(math.inf, lambda: cancelled.append(2)).cancel()
    await fired.wait()
    await asyncio.sleep(0)  # sleep-ok: one more loop turn, in which the cancelled timer would run
    assert cancelled == []


async def test_system_clock_sleep_zero_returns() -> None:
    clock = SystemClock()
    before = clock.monotonic()
    await clock.sleep(0)
    assert clock.monotonic() >= before
    assert clock.time() > 1.7e9


def test_ids_have_the_documented_shapes() -> None:
    mid = message_id()
    assert is_message_id(mid) and len(mid) == 14
    sid = session_id()
    assert sid.startswith("s-") and len(sid) == 14
    assert message_id() != message_id()
    assert call_id(3, 2, 1) == "c3-2-1"
    assert parse_call_id("c12-4-10") == (12, 4, 10)
    assert is_call_id("c1-1-1") and not is_call_id("c0-1-1") and not is_call_id("call_1")
    with pytest.raises(ValueError, match="call id"):
        parse_call_id("c1-1")
    with pytest.raises(ValueError, match="start at 1"):
        call_id(0, 1, 1)


def test_grace_policy() -> None:
    g = GracePolicy()
    assert (g.interrupt, g.term_after, g.kill_after, g.kill_at) == (True, 2.0, 3.0, 5.0)
    assert GracePolicy.parse("0.2,0.3") == GracePolicy(term_after=0.2, kill_after=0.3)
    assert math.isinf(GracePolicy.parse("inf,1").term_after)
    for bad in ("1", "a,b", "1,2,3"):
        with pytest.raises(ValueError, match="--grace"):
            GracePolicy.parse(bad)
    with pytest.raises(ValueError, match=">= 0"):
        GracePolicy(term_after=-1)
    with pytest.raises(TypeError):
        GracePolicy(term_after="2")  # type: ignore[arg-type]
