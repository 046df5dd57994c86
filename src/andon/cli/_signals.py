"""Signals from the first instruction of ``main`` to the last (docs/ci.md, Timeouts and
cancellation).

A CI runner signals at any moment, often in the first second, often the whole process group. So
the ``andon`` command keeps one :data:`LEDGER` of the signals it received, for the whole life of
the process, in three phases:

* **early** (argument parsing, settings, the model spec — nothing started yet): a Python-level
  handler records the signal and raises :class:`Stopped`, which ``main`` turns into one line and
  exit code 128 + the signal's number. Nothing exists to stop, and no session folder was created.
* **loop** (``andon run``): the event loop's handlers (``loop.add_signal_handler``) replace the
  early ones; they record into the same ledger and stop the agent (``andon.cli._ladder``).
* **late** (after the loop, until the process exits): the loop's own close would restore the
  default actions, under which a second signal kills the process and changes its exit status. The
  signals are blocked before the loop ends and handed to a handler that only records: the first
  signal decides the exit code, always.

A SIGHUP ignored on entry (``nohup andon run …``) stays ignored. SIGINT and SIGTERM are always
handled, ignored on entry or not: a CI job must always be able to stop its agent (a shell starts
background jobs with SIGINT ignored).

The early handlers are installed by the command's entry module (``andon.cli``) before anything
else is imported, so the only moments out of reach are the interpreter's own start-up (~15 ms):
a signal there ends the process by its default action, before anything of andon exists (a shell
reports it as 128 + the signal's number all the same). This module imports nothing heavy.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Final

__all__ = [
    "HANDLED",
    "LEDGER",
    "Ledger",
    "Stopped",
    "install_early",
    "record_only",
    "stopped_in",
]

HANDLED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A signal arrived before anything started. A ``BaseException``: no ``except Exception``
    on the way out may swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stopped_in(error: BaseException) -> Stopped | None:
    """The :class:`Stopped` behind ``error``, if a signal is why it was raised.

    Python wraps an exception that a signal handler raises at certain moments (inside a class
    body's ``__set_name__``, an import, an exception group): the stop is then the cause or the
    context of what arrives, or one member of a group.
    """
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, Stopped):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                todo.append(linked)
    return None


class Ledger:
    """Every handled signal this process received (a plain class: no dataclass import this
    early)."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.count = 0
        self.early = True  # the early handler raises Stopped (once)
        self.installed = False
        self.handled: tuple[int, ...] = ()  # what andon handles (not what was ignored on entry)
        self.order: list[int] = []  # the first few, in the order they arrived (for messages)
        # The early stop was raised where Python could only print it (see _quiet_stops): the
        # command went on, and its exit code must still be the signal's.
        self.lost_stop = False

    def record(self, signum: int) -> None:
        self.count += 1
        if self.first is None:
            self.first = signum
        if len(self.order) < 8:
            self.order.append(signum)

    def names(self) -> str:
        """The signals so far, in order: ``SIGTERM, SIGINT, SIGINT``."""
        return ", ".join(signal.Signals(s).name for s in self.order)


LEDGER: Final = Ledger()


def install_early() -> Ledger:
    """Handle the signals from here on (idempotent: the entry module and ``main`` both call it;
    only the first call sees the dispositions andon was started with)."""
    if LEDGER.installed:
        return LEDGER
    LEDGER.installed = True
    handled = []
    for signum in HANDLED:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # nohup: the user asked for hang-ups to be ignored
        signal.signal(signum, _early)
        handled.append(signum)
    LEDGER.handled = tuple(handled)
    sys.unraisablehook = _quiet_stops(sys.unraisablehook)
    return LEDGER


def _quiet_stops(
    hook: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], object]:
    """``hook``, but silent for a :class:`Stopped`.

    The early handler raises in whatever frame runs, and some frames cannot pass an exception on
    (an import lock's weakref callback, a ``__del__``): Python prints it as "Exception ignored"
    with a traceback and goes on. The signal is in the ledger all the same, and the run stops at
    its next look (``main`` exits 128 + the first signal's number), so there is nothing to print.
    """

    def quiet(unraisable: sys.UnraisableHookArgs) -> object:
        if isinstance(unraisable.exc_value, Stopped):
            LEDGER.lost_stop = True
            return None
        return hook(unraisable)

    return quiet


def _early(signum: int, _frame: FrameType | None) -> None:
    LEDGER.record(signum)
    if LEDGER.early:
        LEDGER.early = False  # one unwinding: a second signal on the way out is only recorded
        raise Stopped(signum)


def record_only(signum: int, _frame: FrameType | None = None) -> None:
    """The handler after the loop: the exit code is decided; a signal is only counted."""
    LEDGER.record(signum)
