"""Abort semantics (docs/architecture.md, The cancellation primitive)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from andon.base import (
    AbortController,
    Aborted,
    Disposed,
    Hook,
    Parent,
    User,
    any_signal,
)


def test_first_cause_wins_and_is_kept_as_given() -> None:
    controller = AbortController()
    first = Hook("turn budget exceeded: 5s")
    assert controller.abort(first) is True
    assert controller.abort(User()) is False
    assert controller.signal.aborted
    assert controller.signal.reason is first


def test_throw_if_aborted_carries_the_cause() -> None:
    controller = AbortController()
    controller.signal.throw_if_aborted()  # live: no error
    controller.abort(Parent())
    with pytest.raises(Aborted) as info:
        controller.signal.throw_if_aborted()
    assert info.value.reason == Parent()


def test_callbacks_run_synchronously_in_registration_order() -> None:
    controller = AbortController()
    seen: list[tuple[str, object]] = []
    controller.signal.add_callback(lambda c: seen.append(("a", c)))
    controller.signal.add_callback(lambda c: seen.append(("b", c)))
    controller.signal.add_callback(lambda c: seen.append(("c", c)))
    controller.abort(User())
    assert seen == [("a", User()), ("b", User()), ("c", User())]
    controller.abort(Disposed())
    assert len(seen) == 3  # callbacks fire once


def test_a_raising_callback_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    controller = AbortController()
    seen: list[str] = []

    def boom(_cause: object) -> None:
        raise RuntimeError("observer bug")

    controller.signal.add_callback(lambda _c: seen.append("before"))
    controller.signal.add_callback(boom)
    controller.signal.add_callback(lambda _c: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger="andon.abort"):
        controller.abort(User())
    assert seen == ["before", "after"]
    assert "observer bug" in caplog.text


def test_removed_callback_does_not_run_and_late_callback_runs_at_once() -> None:
    controller = AbortController()
    seen: list[str] = []
    handle = controller.signal.add_callback(lambda _c: seen.append("removed"))
    handle.remove()
    handle.remove()  # idempotent
    controller.abort(User())
    assert seen == []
    controller.signal.add_callback(lambda _c: seen.append("late"))
    assert seen == ["late"]


def test_any_signal_takes_the_reason_of_the_first_to_fire() -> None:
    a, b = AbortController(), AbortController()
    with any_signal(a.signal, b.signal) as linked:
        assert not linked.aborted
        b.abort(Parent())
        a.abort(User())
        assert linked.reason == Parent()


def test_any_signal_of_an_already_aborted_source() -> None:
    a, b = AbortController(), AbortController()
    b.abort(Hook("x"))
    linked = any_signal(a.signal, b.signal)
    assert linked.reason == Hook("x")
    assert not a.signal._callbacks  # nothing was left registered on the live source


def test_any_signal_disposal_unhooks_from_long_lived_sources() -> None:
    session = AbortController()
    for _ in range(100):  # one link per turn must not pile up on the session signal
        turn = AbortController()
        with any_signal(session.signal, turn.signal):
            pass
    assert len(session.signal._callbacks) == 0
    linked = any_signal(session.signal, AbortController().signal)
    linked.dispose()
    session.abort(User())
    assert not linked.aborted  # disposed links no longer follow


def test_any_signal_detaches_once_fired() -> None:
    a, b = AbortController(), AbortController()
    linked = any_signal(a.signal, b.signal)
    a.abort(User())
    assert linked.aborted
    assert not b.signal._callbacks


async def test_wait_wakes_on_abort() -> None:
    controller = AbortController()
    waiter = asyncio.create_task(controller.signal.wait())
    await asyncio.sleep(0)  # sleep-ok: one loop tick so the waiter is parked on the signal
    assert not waiter.done()
    controller.abort(Hook("stop"))
    assert await asyncio.wait_for(waiter, 5) == Hook("stop")
    assert await controller.signal.wait() == Hook("stop")  # already aborted: immediate


async def test_cancelled_wait_leaves_no_callback() -> None:
    controller = AbortController()
    waiter = asyncio.create_task(controller.signal.wait())
    await asyncio.sleep(0)  # sleep-ok: let the waiter register before cancelling it
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not controller.signal._callbacks


async def test_wait_wakes_when_aborted_from_another_thread() -> None:
    controller = AbortController()
    waiter = asyncio.create_task(controller.signal.wait())
    await asyncio.sleep(0)  # sleep-ok: let the waiter register first
    thread = threading.Thread(target=controller.abort, args=(User(),))
    thread.start()
    assert await asyncio.wait_for(waiter, 5) == User()
    thread.join()


def test_wait_blocking_for_sync_tools() -> None:
    controller = AbortController()
    assert controller.signal.wait_blocking(0) is False
    threading.Timer(0.01, controller.abort, args=(User(),)).start()
    assert controller.signal.wait_blocking(10) is True
