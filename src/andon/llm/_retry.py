"""Retry policy of the model adapters (docs/models.md, Errors and retries), shared by the HTTP
adapter and :class:`~andon.llm.Scripted` so a script exercises exactly the production behaviour.

* Which failures are retried is decided by the error's code alone (:data:`RETRYABLE_CODES`); the
  adapter only asks while nothing of the attempt has streamed yet.
* Backoff: 0.5 s, 1 s, 2 s, 4 s, 8 s, 8 s ... with jitter that only ever *shortens* a delay, so the
  documented schedule is an upper bound and many clients rejected together still spread out.
* ``Retry-After`` replaces the backoff when the server sent one, capped at 60 s.
* The backoff sleep runs on an injected :class:`~andon.base.Clock` and ends at once, raising
  :class:`~andon.base.Aborted`, when the turn's signal fires.
* A caller may replace the policy with its own decision (:data:`~andon.llm.RetryDecider`, the
  seam of the ``OnRequestError`` hook); :func:`retry_delay` is the one place both adapters ask.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias, final

from andon.base import AbortSignal, Cause, Clock, ErrorCode, ModelError
from andon.llm._types import RetryDecider

__all__ = [
    "RETRYABLE_CODES",
    "RandomSource",
    "RetryPolicy",
    "abortable_sleep",
    "code_for_status",
    "parse_retry_after",
    "retry_delay",
]

RandomSource: TypeAlias = Callable[[], float]
"""A source of uniform floats in ``[0, 1)``, such as ``random.Random(7).random`` in a test."""

RETRYABLE_CODES: Final[frozenset[ErrorCode]] = frozenset(
    {
        ErrorCode.CONNECTION,
        ErrorCode.TIMEOUT,
        ErrorCode.RATE_LIMITED,
        ErrorCode.SERVER,
        ErrorCode.OVERLOADED,
    }
)
"""Model error codes worth another attempt (the table of docs/models.md, Errors and
retries). Everything else is final: retrying a bad request, a missing key or an exhausted script
cannot succeed."""

_STATUS_CODES: Final[dict[int, ErrorCode]] = {
    400: ErrorCode.BAD_REQUEST,
    401: ErrorCode.AUTH,
    402: ErrorCode.INSUFFICIENT_BALANCE,
    403: ErrorCode.AUTH,
    404: ErrorCode.BAD_REQUEST,
    422: ErrorCode.BAD_REQUEST,
    429: ErrorCode.RATE_LIMITED,
    500: ErrorCode.SERVER,
    502: ErrorCode.SERVER,
    503: ErrorCode.OVERLOADED,
    504: ErrorCode.SERVER,
}


def code_for_status(status: int) -> ErrorCode:
    """The model error code of an HTTP error status.

    Statuses outside the table of docs/models.md fall back by class: any other 5xx is ``SERVER``
    (the server's trouble, worth a retry), any other status ``BAD_REQUEST`` (our request, not worth
    one).
    """
    known = _STATUS_CODES.get(status)
    if known is not None:
        return known
    return ErrorCode.SERVER if 500 <= status <= 599 else ErrorCode.BAD_REQUEST


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Seconds to wait according to a ``Retry-After`` header, or ``None`` if it is unusable.

    The header is either a number of seconds or an HTTP date; ``now`` (unix seconds, from the
    clock's ``time()``) turns a date into a delay. A date in the past means "now" (0.0). The cap is
    applied by :class:`RetryPolicy`, not here, so callers can log what the server asked for.
    """
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    import email.utils  # only a date needs it (the email package is most of this module's cost)

    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive result means the zone was omitted
        return None
    return max(0.0, when.timestamp() - now)


@final
@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how long to wait before another attempt.

    ``retry`` below counts retries, starting at 1 for the second attempt. The nominal backoff of
    retry ``k`` is ``min(max_delay, base_delay * 2**(k-1))``; jitter takes off up to ``jitter`` of
    it (a fraction in ``[0, 1]``). A server's ``retry_after`` is used instead, capped at
    ``max_retry_after``.
    """

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("base_delay", "max_delay", "max_retry_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter!r}")

    def is_retryable(self, error: ModelError) -> bool:
        """Whether the error's code is one worth another attempt (ignores the retry budget)."""
        return error.code in RETRYABLE_CODES

    def backoff(self, retry: int, rng: RandomSource | None = None) -> float:
        """The exponential delay before retry number ``retry`` (1-based), jittered by ``rng``."""
        if retry < 1:
            raise ValueError(f"retry counts from 1, got {retry}")
        # Cap the exponent before computing: 2**k for a huge k would overflow a float.
        nominal = min(self.max_delay, self.base_delay * 2.0 ** min(retry - 1, 64))
        draw = (rng or random.random)()
        return nominal * (1.0 - self.jitter * draw)

    def delay(self, error: ModelError, retry: int, rng: RandomSource | None = None) -> float:
        """The wait before retry ``retry`` after ``error``: its ``retry_after`` (capped) if any."""
        if error.retry_after is not None:
            return min(self.max_retry_after, max(0.0, error.retry_after))
        return self.backoff(retry, rng)

    def next_delay(
        self, error: ModelError, retry: int, rng: RandomSource | None = None
    ) -> float | None:
        """The decision: the delay before retry ``retry``, or ``None`` to give up and raise."""
        if not self.is_retryable(error) or retry > self.max_retries:
            return None
        return self.delay(error, retry, rng)


async def retry_delay(
    error: ModelError,
    attempt: int,
    *,
    policy: RetryPolicy,
    rng: RandomSource | None,
    decide_retry: RetryDecider | None,
) -> float | None:
    """The seconds to wait before retrying failed attempt ``attempt``, or ``None`` to give up.

    Only asked while nothing of the attempt has streamed (the callers' rule, not checked here).
    Without ``decide_retry`` the policy decides; with it, the decider alone does — it may retry
    codes the policy would not and give up on ones it would retry, and the policy's budget
    (``max_retries``) does not apply: the decider owns the budget. No ceiling is added on top:
    a decider is told the attempt number, a cap would silently overrule an explicit decision,
    and a runaway decider is still stopped by the turn's signal (every wait is abort-aware).
    """
    if decide_retry is None:
        return policy.next_delay(error, attempt, rng)
    # ``object``: the annotation is a promise of the caller's code, checked here at run time.
    delay: object = await decide_retry(error, attempt)
    if delay is None:
        return None
    if (
        isinstance(delay, bool)  # an int subclass, but True is no number of seconds
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or delay < 0
    ):
        raise ModelError(
            ErrorCode.INTERNAL,
            f"the retry decision returned an invalid delay {delay!r} after attempt {attempt} "
            f"failed with {error.code}; return a finite number of seconds >= 0 to retry, "
            "or None to give up",
        ) from error
    return float(delay)


async def abortable_sleep(clock: Clock, seconds: float, signal: AbortSignal) -> None:
    """Sleep ``seconds`` on ``clock``, raising :class:`Aborted` the moment ``signal`` fires.

    Raises at once if the signal has already fired. No polling and no task: one future, resolved
    either by a :meth:`~andon.base.Clock.call_at` timer or by the signal's callback. A cancel of
    the caller propagates as ``CancelledError`` (the future is simply abandoned); nothing is left
    pending afterwards — the timer is cancelled and the callback removed on every way out.
    """
    signal.throw_if_aborted()
    if seconds <= 0:
        return
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_cause: Cause | None = None) -> None:
        # The timer and the signal's callback both only resolve the future; the abort is raised
        # below from the signal's state, so a timer and an abort that fire in the same loop
        # iteration still end in Aborted, whichever ran first.
        if not woken.done():
            woken.set_result(None)

    timer = clock.call_at(clock.monotonic() + seconds, wake)
    handle = signal.add_callback(wake)
    try:
        # A cancel of the caller cancels ``woken`` itself (or, when ``woken`` is already done,
        # is thrown in here by the task): CancelledError propagates, never turned into Aborted.
        await woken
    finally:
        timer.cancel()
        handle.remove()
    # The timer may have fired in the same loop iteration as the abort: the abort wins.
    signal.throw_if_aborted()
