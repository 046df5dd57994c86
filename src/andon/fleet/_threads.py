"""Blocking engine requests in threads of a launcher's own, as futures of its event loop.

The container and Kubernetes clients are synchronous. Each request runs in a thread of its own
(never the loop's shared executor, which a few long ``wait`` or ``watch`` calls would fill), and
its result or error comes back to the loop as a future.

A start request is the delicate one: if the coroutine awaiting it is cancelled (the pool closed
during the start), the engine may still create the container or Pod a moment later, and nobody
would ever remove it. ``run(..., orphan=…)`` hands such a late result to ``orphan``, and
``join_starts`` lets a launcher's close wait for every start still in flight before it sweeps what
carries its label, so nothing created after the sweep survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["EngineThreads"]

_T = TypeVar("_T")


class EngineThreads:
    """The threads of one launcher: started from its event loop, joined at its close."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._starts: set[threading.Thread] = set()

    def run(
        self,
        fn: Callable[[], _T],
        name: str,
        *,
        orphan: Callable[[_T], None] | None = None,
    ) -> asyncio.Future[_T]:
        """``fn()`` in a new thread; its outcome as a future of the running loop.

        With ``orphan``, the request is a start: when its future was cancelled (or the loop has
        closed) by the time ``fn`` returns a value, ``orphan(value)`` runs (in a thread) so that
        what was created is undone rather than left behind."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def settle(value: _T | None, error: BaseException | None) -> None:
            if future.done():  # cancelled while the request ran
                if error is None and orphan is not None:
                    self.run(lambda: orphan(value), f"orphan-{name}")  # type: ignore[arg-type]
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)  # type: ignore[arg-type]

        def body() -> None:
            try:
                try:
                    value = fn()
                except BaseException as e:  # handed to the loop, never lost in a thread
                    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                        loop.call_soon_threadsafe(settle, None, e)
                    return
                try:
                    loop.call_soon_threadsafe(settle, value, None)
                except RuntimeError:  # the loop is closed: nobody will take what was made
                    if orphan is not None:
                        with contextlib.suppress(Exception):
                            orphan(value)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())
                    self._starts.discard(threading.current_thread())

        thread = threading.Thread(target=body, name=f"{self._prefix}-{name}", daemon=True)
        with self._lock:
            self._threads.add(thread)
            if orphan is not None:
                self._starts.add(thread)
        thread.start()
        return future

    def join_starts(self, timeout: float) -> None:
        """Wait (blocking, bounded) for the start requests still running."""
        self._join(lambda: self._starts, timeout)

    def join(self, timeout: float, skip: str | None = None) -> None:
        """Wait (blocking, bounded) for every thread, including those started meanwhile (an
        orphan's clean-up), but those whose request name starts with ``skip``."""
        prefix = None if skip is None else f"{self._prefix}-{skip}"
        self._join(
            lambda: {t for t in self._threads if prefix is None or not t.name.startswith(prefix)},
            timeout,
        )

    def _join(self, which: Callable[[], set[threading.Thread]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                threads = [t for t in which() if t is not threading.current_thread()]
            left = deadline - time.monotonic()
            if not threads or left <= 0:
                return
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
