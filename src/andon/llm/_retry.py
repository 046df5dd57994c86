"""Retry policy of the model adapters (llm.md, Errors and retries), shared by the HTTP adapter and
:class:`~andon.llm.Scripted` so a script exercises exactly the production behaviour.

* Which failures are retried is decided by the error's code alone (:data:`RETRYABLE_CODES`); the
  adapter only asks while nothing of the attempt has streamed yet.
* Backoff: 0.5 s, 1 s, 2 s, 4 s, 8 s, 8 s ... with jitter that only ever *shortens* a delay, so the
  documented schedule is an upper bound and many clients rejected together still spread out.
* ``Retry-After`` replaces the backoff when the server sent one, capped at 60 s.
* The backoff sleep runs on an injected :class:`~andon.base.Clock` and ends at once, raising
  :class:`~andon.base.Aborted`, when the turn's signal fires.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from andon.base import Aborted, AbortSignal, Clock, ErrorCode, ModelError

__all__ = [
    "RETRYABLE_CODES",
    "RandomSource",
    "RetryPolicy",
    "abortable_sleep",
    "code_for_status",
    "parse_retry_after",
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
"""Model error codes worth another attempt (llm.md's table). Everything else is final: retrying a
bad request, a missing key or an exhausted script cannot succeed."""

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

    Statuses outside llm.md's table fall back by class: any other 5xx is ``SERVER`` (the server's
    trouble, worth a retry), any other status ``BAD_REQUEST`` (our request, not worth one).
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
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive result means the zone was omitted
        return None
    return max(0.0, when.timestamp() - now)


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


async def abortable_sleep(clock: Clock, seconds: float, signal: AbortSignal) -> None:
    """Sleep ``seconds`` on ``clock``, raising :class:`Aborted` the moment ``signal`` fires.

    Raises at once if the signal has already fired. No polling: the clock's sleep runs as this
    function's own task, and the signal's callback cancels that task (never the caller's).
    """
    signal.throw_if_aborted()
    if seconds <= 0:
        return
    # Always awaited below (or cancelled and awaited in the finally): never fire-and-forget.
    sleeper = asyncio.create_task(clock.sleep(seconds))
    handle = signal.add_callback(lambda _cause: sleeper.cancel())
    try:
        await sleeper
    except asyncio.CancelledError:
        current = asyncio.current_task()
        caller_cancelled = current is not None and current.cancelling() > 0
        # Our callback cancelled the sleeper: translate into the typed abort. A cancel of the
        # caller itself (teardown) must propagate as CancelledError, never be swallowed.
        reason = signal.reason
        if reason is not None and not caller_cancelled:
            raise Aborted(reason) from None
        raise
    finally:
        handle.remove()
        if not sleeper.done():
            sleeper.cancel()
            # The caller is being cancelled; wait for the sleeper so it is not left behind.
            await asyncio.gather(sleeper, return_exceptions=True)
    # The sleep may have completed in the same loop iteration as the abort: the abort wins.
    signal.throw_if_aborted()
