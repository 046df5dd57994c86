"""The retry policy of the model adapters (docs/models.md, Errors and retries)."""

from __future__ import annotations

import asyncio
import email.utils
import random

import pytest

from andon.base import AbortController, Aborted, ErrorCode, Hook, ManualClock, ModelError, User
from andon.llm import (
    RETRYABLE_CODES,
    RetryPolicy,
    abortable_sleep,
    code_for_status,
    parse_retry_after,
)


def never_jitter() -> float:
    return 0.0


def error(code: ErrorCode = ErrorCode.SERVER, retry_after: float | None = None) -> ModelError:
    return ModelError(code, "test failure", retry_after=retry_after)


@pytest.mark.parametrize(
    ("status", "code", "retried"),
    [
        (429, ErrorCode.RATE_LIMITED, True),
        (500, ErrorCode.SERVER, True),
        (502, ErrorCode.SERVER, True),
        (504, ErrorCode.SERVER, True),
        (503, ErrorCode.OVERLOADED, True),
        (400, ErrorCode.BAD_REQUEST, False),
        (404, ErrorCode.BAD_REQUEST, False),
        (422, ErrorCode.BAD_REQUEST, False),
        (401, ErrorCode.AUTH, False),
        (403, ErrorCode.AUTH, False),
        (402, ErrorCode.INSUFFICIENT_BALANCE, False),
        # Outside the table: the status class decides.
        (599, ErrorCode.SERVER, True),
        (418, ErrorCode.BAD_REQUEST, False),
    ],
)
def test_status_maps_to_code_and_retry_decision(
    status: int, code: ErrorCode, retried: bool
) -> None:
    assert code_for_status(status) is code
    assert (code in RETRYABLE_CODES) is retried
    assert RetryPolicy().is_retryable(ModelError(code, "x", status=status)) is retried


def test_only_transient_codes_are_retryable() -> None:
    assert {
        ErrorCode.CONNECTION,
        ErrorCode.TIMEOUT,
        ErrorCode.RATE_LIMITED,
        ErrorCode.SERVER,
        ErrorCode.OVERLOADED,
    } == RETRYABLE_CODES
    for final in (
        ErrorCode.STREAM_TRUNCATED,
        ErrorCode.MALFORMED_STREAM,
        ErrorCode.CONTENT_FILTER,
        ErrorCode.SCRIPT_EXHAUSTED,
        ErrorCode.CONTEXT_OVERFLOW,
    ):
        assert RetryPolicy().next_delay(error(final), 1, never_jitter) is None


def test_backoff_doubles_from_half_a_second_and_caps_at_eight() -> None:
    policy = RetryPolicy()
    delays = [policy.backoff(retry, never_jitter) for retry in range(1, 8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert policy.backoff(10_000, never_jitter) == 8.0  # no float overflow for a huge retry


def test_jitter_with_a_fixed_rng_is_deterministic_and_only_shortens() -> None:
    policy = RetryPolicy()
    half = [policy.backoff(retry, lambda: 0.5) for retry in range(1, 7)]
    assert half == pytest.approx([0.45, 0.9, 1.8, 3.6, 7.2, 7.2])

    first = [policy.backoff(r, random.Random(7).random) for r in range(1, 7)]
    again = [policy.backoff(r, random.Random(7).random) for r in range(1, 7)]
    assert first == again
    for retry, delay in enumerate(first, start=1):
        nominal = min(8.0, 0.5 * 2 ** (retry - 1))
        assert 0.8 * nominal < delay <= nominal


def test_default_rng_stays_within_the_schedule() -> None:
    policy = RetryPolicy()
    for _ in range(50):
        assert 6.4 < policy.backoff(5) <= 8.0


def test_retry_after_replaces_backoff_and_is_capped_at_sixty_seconds() -> None:
    policy = RetryPolicy()
    assert policy.delay(error(retry_after=0.2), 1, never_jitter) == 0.2
    assert policy.delay(error(retry_after=30.0), 3, never_jitter) == 30.0
    assert policy.delay(error(retry_after=120.0), 1, never_jitter) == 60.0
    assert policy.delay(error(retry_after=-5.0), 1, never_jitter) == 0.0
    assert policy.next_delay(error(ErrorCode.RATE_LIMITED, 3600.0), 1, never_jitter) == 60.0


def test_retries_stop_after_max_retries() -> None:
    policy = RetryPolicy(max_retries=3)
    delays = [policy.next_delay(error(), retry, never_jitter) for retry in (1, 2, 3, 4)]
    assert delays == [0.5, 1.0, 2.0, None]
    assert RetryPolicy(max_retries=0).next_delay(error(), 1, never_jitter) is None
    assert RetryPolicy().max_retries == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries": -1},
        {"base_delay": -0.5},
        {"max_delay": float("inf")},
        {"max_retry_after": float("nan")},
        {"jitter": 1.5},
    ],
)
def test_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


NOW = 1_764_661_200.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("5", 5.0),
        (" 1.5 ", 1.5),
        ("0", 0.0),
        ("-2", 0.0),
        (email.utils.formatdate(NOW + 30, usegmt=True), 30.0),
        (email.utils.formatdate(NOW - 30, usegmt=True), 0.0),
        ("", None),
        ("soon", None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_retry_after(header: str, seconds: float | None) -> None:
    assert parse_retry_after(header, now=NOW) == seconds


async def test_abortable_sleep_ends_when_the_clock_reaches_the_deadline() -> None:
    clock = ManualClock()
    signal = AbortController().signal
    async with asyncio.TaskGroup() as tg:
        sleeping = tg.create_task(abortable_sleep(clock, 2.0, signal))
        await clock.wait_for_sleepers(1)
        clock.advance(1.5)
        assert not sleeping.done()
        assert clock.sleepers == 1
        clock.advance(0.5)
    assert not signal._callbacks  # the abort hook is removed once the sleep is over


async def test_abort_during_backoff_sleep_raises_at_once() -> None:
    clock = ManualClock()
    controller = AbortController()
    outcome: list[BaseException] = []

    async def sleep() -> None:
        try:
            await abortable_sleep(clock, 8.0, controller.signal)
        except Aborted as exc:
            outcome.append(exc)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(sleep())
        await clock.wait_for_sleepers(1)
        controller.abort(Hook("turn budget exceeded: 5s"))
    # The clock was never advanced: only the abort can have ended the sleep.
    (aborted,) = outcome
    assert isinstance(aborted, Aborted)
    assert aborted.reason == Hook("turn budget exceeded: 5s")
    assert clock.sleepers == 0
    assert not controller.signal._callbacks


async def test_abortable_sleep_on_an_aborted_signal_does_not_sleep() -> None:
    clock = ManualClock()
    controller = AbortController()
    controller.abort(User())
    with pytest.raises(Aborted) as info:
        await abortable_sleep(clock, 1.0, controller.signal)
    assert info.value.reason == User()
    assert clock.sleepers == 0


async def test_abortable_sleep_of_zero_returns_without_the_clock() -> None:
    clock = ManualClock()
    await abortable_sleep(clock, 0.0, AbortController().signal)
    assert clock.monotonic() == 1000.0


async def test_cancelling_the_caller_is_not_turned_into_an_abort() -> None:
    clock = ManualClock()
    controller = AbortController()
    task = asyncio.create_task(abortable_sleep(clock, 5.0, controller.signal))
    await clock.wait_for_sleepers(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.sleepers == 0
    assert not controller.signal._callbacks


async def test_abortable_sleep_creates_no_task() -> None:
    clock = ManualClock()
    controller = AbortController()
    before = asyncio.all_tasks()
    sleeping = asyncio.create_task(abortable_sleep(clock, 5.0, controller.signal))
    await clock.wait_for_sleepers(1)
    # Only the sleeping caller itself: the wait is a timer and a future, not a helper task.
    assert asyncio.all_tasks() - before == {sleeping}
    clock.advance(5.0)
    await sleeping
    assert clock.sleepers == 0
    assert not controller.signal._callbacks


async def test_abort_wins_when_it_fires_in_the_same_loop_iteration_as_the_timer() -> None:
    clock = ManualClock()
    controller = AbortController()
    sleeping = asyncio.create_task(abortable_sleep(clock, 2.0, controller.signal))
    await clock.wait_for_sleepers(1)
    clock.advance(2.0)  # the timer is due and runs on the loop, before the sleeper resumes
    controller.abort(User())
    with pytest.raises(Aborted) as info:
        await sleeping
    assert info.value.reason == User()
    assert clock.sleepers == 0
    assert not controller.signal._callbacks


async def test_a_cancel_of_the_caller_beats_an_abort_in_the_same_loop_iteration() -> None:
    clock = ManualClock()
    controller = AbortController()
    sleeping = asyncio.create_task(abortable_sleep(clock, 5.0, controller.signal))
    await clock.wait_for_sleepers(1)
    controller.abort(User())  # resolves the sleep's future ...
    sleeping.cancel()  # ... but the task is cancelled before it resumes: that must propagate
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    assert clock.sleepers == 0
    assert not controller.signal._callbacks
