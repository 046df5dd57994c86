"""No test can hang the suite: three layers of time limits, each a backstop for the one before.

pytest-timeout alone is not enough for this suite. Its default method raises ``Failed`` (a
``BaseException``) from a SIGALRM handler in whatever frame runs at that moment, and in an asyncio
test that is often a task's coroutine step: ``asyncio.Task`` stores any ``BaseException`` but
``KeyboardInterrupt``/``SystemExit`` as the task's result, so a timeout that lands in a background
task is swallowed and the test waits on forever (seen in CI: a test sat in the loop's ``select``
for 20 minutes). And ``asyncio.run`` waits without a bound for every task to finish after its
cancellation, so a task that ignores it hangs the run's clean-up as well.

So, for every test, with ``T`` its timeout (the ``timeout`` marker or ini value):

1. **At T, in the loop** (``async def`` tests): the test's main task is cancelled, the way any
   asyncio code is stopped, and the test fails with ``Timeout``. What is left of its tasks gets
   a bounded clean-up (:data:`CLEANUP`); a task that ignores its cancellation is named and fails
   the test instead of hanging it. pytest-timeout's own alarm moves to ``T + ALARM_AFTER`` for
   these tests, for a loop that is blocked in a synchronous call.
2. **At T, by pytest-timeout's alarm** (plain tests): as before.
3. **A backstop later** (ini ``timeout_backstop``, default :data:`BACKSTOP`; counted from the
   alarm: ``T`` for a plain test, ``T + ALARM_AFTER`` for an async one), whatever the test
   does: a watchdog thread prints every thread's stack, kills this run's tagged processes (only
   ours: the run's own tag) and ends the test process with exit code 70. Under xdist the
   controller reports the crashed worker and its test as failed, and the run goes on; alone,
   pytest itself ends non-zero. A C-level ``faulthandler`` timer a backstop later does the same
   without the processes, for a thread that never lets go of the GIL.

Loaded by ``tests/conftest.py`` (its hooks are imported there) and, for the suite's own test of the
mechanism, as a plugin (``-p tests._limits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import inspect
import io
import os
import signal
import sys
import threading
from collections.abc import Coroutine, Generator
from typing import Any

import pytest

from andon import procs
from tests.support import RUN_ENTRY

CLEANUP = 5.0
"""Seconds the tasks an async test left behind get to end after their cancellation (less than
:data:`ALARM_AFTER`: the clean-up is over before the alarm can land in it)."""
ALARM_AFTER = 10.0
"""Seconds after an async test's in-loop limit that pytest-timeout's alarm fires."""
BACKSTOP = 30.0
"""Default seconds past a test's timeout before the watchdog ends the test process."""
EXIT_HUNG = 70
"""The test process's exit status when the watchdog ends it (EX_SOFTWARE)."""

_LIMIT = pytest.StashKey[float]()
"""The in-loop limit of an async test (its timeout as written, before the alarm was moved)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "timeout_backstop",
        "seconds past a test's timeout before the watchdog ends the test process",
        default=str(BACKSTOP),
    )


def _timeout_of(item: pytest.Item) -> float:
    """The item's timeout in seconds as pytest-timeout reads it (marker, then option/ini); 0 for
    none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    with contextlib.suppress(ValueError):
        return float(item.config.getini("timeout") or 0)
    return 0.0


def _is_async(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        limit = _timeout_of(item)
        if limit > 0 and _is_async(item):
            item.stash[_LIMIT] = limit
            # The loop's own limit comes first; the alarm is for a loop that cannot run.
            item.add_marker(pytest.mark.timeout(limit + ALARM_AFTER))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    limit = _timeout_of(item)
    if limit <= 0:
        return (yield)
    backstop = float(item.config.getini("timeout_backstop"))
    dog = _Watchdog(item.config, item.nodeid, limit, backstop)
    faulthandler.dump_traceback_later(limit + 2 * backstop, exit=True)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
        dog.cancel()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop, within their limit (no plugin needed)."""
    if not _is_async(pyfuncitem):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    run_within(pyfuncitem.obj(**kwargs), pyfuncitem.stash.get(_LIMIT, 0.0))
    return True


def run_within(coro: Coroutine[Any, Any, object], limit: float) -> None:
    """Run ``coro`` on a new event loop; at ``limit`` seconds (0: none) cancel it and fail."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    expired = False
    where: io.StringIO | None = None
    try:
        main = loop.create_task(coro)

        def expire() -> None:
            nonlocal expired, where
            expired = True
            where = io.StringIO()
            main.print_stack(file=where)  # what it waited for: said before the cancel unwinds it
            main.cancel()

        timer = loop.call_later(limit, expire) if limit > 0 else None
        try:
            loop.run_until_complete(main)
        except asyncio.CancelledError:
            if not expired:
                raise
        finally:
            if timer is not None:
                timer.cancel()
        stuck = _end_the_rest(loop)
        if expired:
            stack = where.getvalue() if where is not None else ""
            pytest.fail(
                f"Timeout >{limit:g}s: the test was still waiting in its event loop\n{stack}"
            )
        if stuck:
            pytest.fail(f"the test left tasks that ignored their cancellation: {stuck}")
    finally:
        if not loop.is_closed():
            _end_the_rest(loop)
            loop.close()
        asyncio.set_event_loop(None)


def _end_the_rest(loop: asyncio.AbstractEventLoop) -> str:
    """Cancel the tasks still pending, wait a bounded time, shut the loop's generators and
    executor down (bounded too). Returns the tasks that would not end, described ("" if none)."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    stuck: set[asyncio.Task[Any]] = set()
    if pending:
        _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=CLEANUP))
    for task in pending:
        if task.done() and not task.cancelled() and task.exception() is not None:
            # Retrieved, so that asyncio does not log it at the loop's close: the test's own
            # result already said what went wrong, or the task was a helper of no consequence.
            task.exception()
    with contextlib.suppress(Exception):
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), CLEANUP))
    with contextlib.suppress(Exception):
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), CLEANUP))
    return ", ".join(sorted(repr(t.get_coro()) for t in stuck))


class _Watchdog:
    """Ends the test process when a test outlives its timeout by ``backstop`` seconds."""

    def __init__(self, config: pytest.Config, nodeid: str, limit: float, backstop: float) -> None:
        self._config = config
        self._nodeid = nodeid
        self._limit = limit
        self._backstop = backstop
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="test-watchdog", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self._limit + self._backstop):
            return
        # pytest captures the standard streams by file descriptor: the original ones come back
        # first, so that the message reaches the job log (the process ends right after).
        with contextlib.suppress(Exception):
            capture = self._config.pluginmanager.getplugin("capturemanager")
            if capture is not None:
                capture.suspend_global_capture(in_=False)
        err = sys.__stderr__
        with contextlib.suppress(Exception):
            assert err is not None
            err.write(
                f"\n{self._nodeid} outlived its timeout ({self._limit:g}s) by "
                f"{self._backstop:g}s: ending the test process (exit {EXIT_HUNG}); stacks:\n"
            )
            err.flush()
            faulthandler.dump_traceback(file=err, all_threads=True)
        with contextlib.suppress(Exception):
            procs.signal_tagged(RUN_ENTRY, signal.SIGKILL, wait=3.0)
        os._exit(EXIT_HUNG)
