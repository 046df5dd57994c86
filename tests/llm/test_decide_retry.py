"""A caller's retry decision (``decide_retry``, the seam of the ``OnRequestError`` hook) replaces
the retry policy, through the HTTP adapter against the real mock server and through ``Scripted``
alike (docs/models.md, Errors and retries; docs/agent-loop.md, Hooks)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from andon.base import AbortController, Aborted, ErrorCode, ManualClock, ModelError, User
from andon.llm import (
    Chunk,
    Finish,
    Model,
    ModelRequest,
    OpenAICompatible,
    RetryDecider,
    Scripted,
    TextDelta,
)
from andon.testing import MockModelServer

REQUEST = ModelRequest(messages=({"role": "user", "content": "Fix the build"},))
KINDS = ("http", "scripted")


class Decider:
    """A ``decide_retry`` that answers with ``answer(error, attempt)`` and records each call."""

    def __init__(self, answer: Callable[[ModelError, int], Any]) -> None:
        self.answer = answer
        self.calls: list[tuple[ErrorCode, int]] = []
        self.asked = asyncio.Event()

    async def __call__(self, error: ModelError, attempt: int) -> Any:
        self.calls.append((error.code, attempt))
        self.asked.set()
        return self.answer(error, attempt)


class Run:
    """One streamed request in its own task; the test waits on events, never on time."""

    def __init__(self, model: Model, decide_retry: RetryDecider | None) -> None:
        self.controller = AbortController()
        self.attempts: list[tuple[int, ErrorCode | None, float | None]] = []
        self.chunks: list[Chunk] = []
        self.streaming = asyncio.Event()  # set at the first chunk
        self.task = asyncio.create_task(self._run(model, decide_retry))

    async def _on_attempt(self, n: int, error: ModelError | None, delay: float | None) -> None:
        self.attempts.append((n, error.code if error else None, delay))

    async def _run(self, model: Model, decide_retry: RetryDecider | None) -> None:
        stream = model.stream(
            REQUEST, self.controller.signal, self._on_attempt, decide_retry=decide_retry
        )
        async for chunk in stream:
            self.chunks.append(chunk)
            self.streaming.set()

    async def error(self) -> BaseException:
        with pytest.raises((ModelError, Aborted)) as info:
            await self.task
        return info.value


class Fixture:
    def __init__(self, model: Model, sent: Callable[[], int]) -> None:
        self.model = model
        self.sent = sent  # how many requests (attempts) reached the model


@asynccontextmanager
async def model_for(
    kind: str, replies: Sequence[Mapping[str, Any]], clock: ManualClock, **options: Any
) -> AsyncIterator[Fixture]:
    """The same replies served by the HTTP adapter over the mock server, or played by Scripted.

    The adapter's own policy is the default one (3 retries of the retryable codes): whatever
    differs from it below was decided by the decider.
    """
    if kind == "scripted":
        scripted = Scripted(replies, clock=clock, **options)
        yield Fixture(scripted, lambda: scripted.consumed)
        return
    async with (
        MockModelServer(replies) as server,
        OpenAICompatible(
            server.base_url, "mock-model", api_key_env=None, clock=clock, **options
        ) as model,
    ):
        yield Fixture(model, lambda: len(server.requests))


@pytest.mark.parametrize("kind", KINDS)
async def test_the_decider_retries_a_code_the_policy_would_not_after_its_own_delay(
    kind: str,
) -> None:
    clock = ManualClock()
    decider = Decider(lambda error, attempt: 7.5)
    replies: list[dict[str, Any]] = [
        {"error": {"status": 400, "message": "try again"}},
        {"text": "fixed"},
    ]
    async with model_for(kind, replies, clock) as fx:
        run = Run(fx.model, decider)
        await decider.asked.wait()
        # The attempt is closed before the decider is asked, so the only timer left is the delay.
        await clock.wait_for_sleepers(1)
        assert fx.sent() == 1
        clock.advance(7.4)
        assert clock.sleepers == 1  # not yet due: the retry waits for the decider's delay
        assert fx.sent() == 1
        clock.advance(0.1)
        await run.task
    assert run.chunks == [TextDelta("fixed"), Finish("stop")]
    assert decider.calls == [(ErrorCode.BAD_REQUEST, 1)]
    # on_attempt sees the decider's delay, so the driver logs llm/retry with it.
    assert run.attempts == [(1, None, None), (2, ErrorCode.BAD_REQUEST, 7.5)]
    assert fx.sent() == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_the_decider_gives_up_on_a_retryable_code_at_the_first_attempt(kind: str) -> None:
    clock = ManualClock()
    decider = Decider(lambda error, attempt: None)
    replies: list[dict[str, Any]] = [
        {"error": {"status": 500, "message": "upstream down"}},
        {"text": "unused"},
    ]
    async with model_for(kind, replies, clock) as fx:
        error = await Run(fx.model, decider).error()
        assert fx.sent() == 1
    assert isinstance(error, ModelError)
    assert error.code is ErrorCode.SERVER  # the failure itself is raised, as without a decider
    assert "upstream down" in error.message
    assert decider.calls == [(ErrorCode.SERVER, 1)]
    assert clock.sleepers == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_the_decider_owns_the_budget_and_counts_attempts_from_one(kind: str) -> None:
    clock = ManualClock()
    # max_retries=0 would raise the first failure; the decider retries twice all the same.
    decider = Decider(lambda error, attempt: 0 if attempt < 3 else None)
    replies = [{"error": {"status": 503}}, {"error": {"status": 429}}, {"error": {"status": 502}}]
    async with model_for(kind, [*replies, {"text": "unused"}], clock, max_retries=0) as fx:
        error = await Run(fx.model, decider).error()
        assert fx.sent() == 3
    assert isinstance(error, ModelError) and error.code is ErrorCode.SERVER
    assert decider.calls == [
        (ErrorCode.OVERLOADED, 1),
        (ErrorCode.RATE_LIMITED, 2),
        (ErrorCode.SERVER, 3),
    ]


@pytest.mark.parametrize(
    "reply",
    [
        {"text": "Hello there", "chunk_size": 5, "error_event": {"after_chunks": 1}},
        {"text": "Hello there", "chunk_size": 5, "truncate_after_chunks": 1},
        {"text": "Hello", "finish": "insufficient_system_resource"},
    ],
    ids=["error-event", "truncated", "overloaded-finish"],
)
async def test_the_decider_is_never_asked_once_data_has_streamed(reply: dict[str, Any]) -> None:
    # HTTP only: a scripted reply either fails before streaming or streams to its end.
    clock = ManualClock()
    decider = Decider(lambda error, attempt: 0.0)  # it would retry anything it was asked about
    async with model_for("http", [reply, {"text": "unused"}], clock) as fx:
        run = Run(fx.model, decider)
        error = await run.error()
        assert fx.sent() == 1
    assert isinstance(error, ModelError)
    assert run.chunks == [TextDelta("Hello")]
    assert decider.calls == []


@pytest.mark.parametrize("kind", KINDS)
async def test_an_abort_is_never_offered_to_the_decider(kind: str) -> None:
    clock = ManualClock()
    decider = Decider(lambda error, attempt: 0.0)
    replies: list[dict[str, Any]] = [
        {"text": "partial", "chunk_size": 4, "stall_after_chunks": 1},
        {"text": "unused"},
    ]
    async with model_for(kind, replies, clock) as fx:
        run = Run(fx.model, decider)
        await run.streaming.wait()  # the stall follows the first chunk
        run.controller.abort(User())
        error = await run.error()
    assert isinstance(error, Aborted) and error.reason == User()
    assert decider.calls == []


@pytest.mark.parametrize("delay", [-1, -0.5, math.nan, math.inf, -math.inf, True, "1"])
@pytest.mark.parametrize("kind", KINDS)
async def test_an_invalid_delay_is_a_clear_error(kind: str, delay: object) -> None:
    clock = ManualClock()
    decider = Decider(lambda error, attempt: delay)
    replies: list[dict[str, Any]] = [{"error": {"status": 429}}, {"text": "unused"}]
    async with model_for(kind, replies, clock) as fx:
        run = Run(fx.model, decider)
        error = await run.error()
        assert fx.sent() == 1
    assert isinstance(error, ModelError)
    assert error.code is ErrorCode.INTERNAL
    assert "retry decision returned an invalid delay" in error.message
    assert repr(delay) in error.message and "RATE_LIMITED" in error.message
    assert isinstance(error.__cause__, ModelError)  # the failure that was being decided on
    assert error.__cause__.code is ErrorCode.RATE_LIMITED
    assert run.attempts == [(1, None, None)]
    assert clock.sleepers == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_an_abort_during_the_deciders_delay_raises_at_once(kind: str) -> None:
    clock = ManualClock()
    decider = Decider(lambda error, attempt: 3600.0)
    replies: list[dict[str, Any]] = [{"error": {"status": 400}}, {"text": "unused"}]
    async with model_for(kind, replies, clock) as fx:
        run = Run(fx.model, decider)
        await decider.asked.wait()
        await clock.wait_for_sleepers(1)
        run.controller.abort(User())
        error = await run.error()
        assert fx.sent() == 1
    # The clock never moved: only the abort can have ended the hour's wait.
    assert isinstance(error, Aborted) and error.reason == User()
    assert run.attempts == [(1, None, None)]
    assert clock.sleepers == 0
    assert not run.controller.signal._callbacks


@pytest.mark.parametrize("kind", KINDS)
async def test_without_a_decider_the_policy_still_decides(kind: str) -> None:
    clock = ManualClock()
    replies: list[dict[str, Any]] = [{"error": {"status": 400}}, {"text": "unused"}]
    async with model_for(kind, replies, clock) as fx:
        error = await Run(fx.model, None).error()
        assert fx.sent() == 1
    assert isinstance(error, ModelError) and error.code is ErrorCode.BAD_REQUEST
