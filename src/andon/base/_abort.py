"""AbortController / AbortSignal: cancellation as a state with a reason.

Rules (docs/architecture.md, The cancellation primitive):

* ``controller.abort(cause)`` is idempotent and **the first cause wins**; the cause object is kept
  as given.
* Callbacks run synchronously inside ``abort()``, in registration order. One that raises is logged
  and does not stop the others: a broken observer must never leave a tool running.
* ``any_signal(a, b)`` aborts when either does, with the reason of the one that fired first, and is
  disposable, so per-turn links never pile up callbacks on a long-lived signal.

A signal is owned by the event loop's thread (``abort`` and ``add_callback`` are called there).
Reading ``aborted`` / ``reason`` and ``wait_blocking`` are safe from any thread, which is what a
synchronous tool running in a worker thread needs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final, final

from andon.base._causes import Cause
from andon.base._errors import Aborted

__all__ = ["AbortController", "AbortSignal", "CallbackHandle", "LinkedSignal", "any_signal"]

_log = logging.getLogger("andon.abort")

Callback = Callable[[Cause], object]


class CallbackHandle:
    """Returned by ``add_callback``; ``remove()`` unregisters (idempotent)."""

    __slots__ = ("_key", "_signal")

    def __init__(self, signal: AbortSignal, key: int) -> None:
        self._signal: AbortSignal | None = signal
        self._key = key

    def remove(self) -> None:
        if self._signal is not None:
            self._signal._callbacks.pop(self._key, None)
            self._signal = None


class AbortSignal:
    """The read side of an abort: observed by every piece of work in a turn."""

    __slots__ = ("__weakref__", "_callbacks", "_event", "_next_key", "_reason")

    def __init__(self) -> None:
        self._reason: Cause | None = None
        # dict keeps insertion order: callbacks run in registration order.
        self._callbacks: dict[int, Callback] = {}
        self._next_key = 0
        # A threading.Event (not an asyncio one) so sync tools in threads can block on it too.
        self._event = threading.Event()

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> Cause | None:
        """The first cause given, or ``None`` while not aborted."""
        return self._reason

    def throw_if_aborted(self) -> None:
        """A checkpoint: raise :class:`Aborted` carrying the cause if the signal has fired."""
        if self._reason is not None:
            raise Aborted(self._reason)

    def add_callback(self, fn: Callback) -> CallbackHandle:
        """Run ``fn(cause)`` when the signal aborts (at once if it already has)."""
        key = self._next_key
        self._next_key += 1
        handle = CallbackHandle(self, key)
        if self._reason is not None:
            _run_callback(fn, self._reason)
            handle._signal = None
            return handle
        self._callbacks[key] = fn
        return handle

    async def wait(self) -> Cause:
        """Return the cause once the signal has aborted (immediately if it already has)."""
        if self._reason is not None:
            return self._reason
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Cause] = loop.create_future()

        def wake(cause: Cause) -> None:
            if fut.done():
                return
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                fut.set_result(cause)
            else:  # aborted from another thread: hand the wake-up to the loop's thread
                loop.call_soon_threadsafe(_set_if_pending, fut, cause)

        handle = self.add_callback(wake)
        try:
            return await fut
        finally:
            handle.remove()

    def wait_blocking(self, timeout: float | None = None) -> bool:
        """Block the calling thread until aborted or ``timeout``; return whether it aborted."""
        return self._event.wait(timeout)

    def _fire(self, cause: Cause) -> bool:
        if self._reason is not None:
            return False  # first cause wins
        self._reason = cause
        self._event.set()
        callbacks = list(self._callbacks.values())
        self._callbacks.clear()
        for fn in callbacks:
            _run_callback(fn, cause)
        return True

    def __repr__(self) -> str:
        state = f"aborted={self._reason!r}" if self._reason is not None else "live"
        return f"<{type(self).__name__} {state}>"


def _set_if_pending(fut: asyncio.Future[Cause], cause: Cause) -> None:
    if not fut.done():
        fut.set_result(cause)


def _run_callback(fn: Callback, cause: Cause) -> None:
    try:
        fn(cause)
    except Exception:  # a raising observer must not stop the others
        _log.exception("abort callback %r raised", fn)


@final
class AbortController:
    """The write side: ``abort(cause)`` fires ``signal`` once; later calls change nothing."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal: Final = AbortSignal()

    def abort(self, cause: Cause) -> bool:
        """Abort with ``cause``; return True if this call was the one that fired the signal."""
        return self.signal._fire(cause)

    @property
    def aborted(self) -> bool:
        return self.signal.aborted


class LinkedSignal(AbortSignal):
    """A signal that follows several others; ``dispose()`` unhooks it from all of them."""

    __slots__ = ("_handles",)

    def __init__(self, sources: tuple[AbortSignal, ...]) -> None:
        super().__init__()
        self._handles: list[CallbackHandle] = []
        for source in sources:
            if source.reason is not None:
                # Already fired: the first source (in argument order) that has a reason wins.
                self._fire(source.reason)
                break
        if self._reason is None:
            self._handles = [source.add_callback(self._fire) for source in sources]

    def _fire(self, cause: Cause) -> bool:
        fired = super()._fire(cause)
        if fired:
            self.dispose()
        return fired

    def dispose(self) -> None:
        """Stop following the sources (idempotent); the signal keeps any reason it has."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def __enter__(self) -> LinkedSignal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.dispose()


def any_signal(*signals: AbortSignal) -> LinkedSignal:
    """A signal that aborts when any of ``signals`` does, with the reason of the first to fire.

    Use it as a context manager (or call ``dispose()``) so the link is removed from long-lived
    sources when the work it guards is over.
    """
    return LinkedSignal(signals)
