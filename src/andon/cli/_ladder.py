"""The loop phase of the signal ladder (docs/ci.md, Timeouts and cancellation): what SIGINT,
SIGTERM and SIGHUP do while ``andon run`` has its event loop, and the loop that hands them back to
the recording handler when it closes.

The ladder: the first signal cancels the turn with its cause (SIGINT: ``user``; SIGTERM, SIGHUP:
``disposed``) and the grace timeline runs; a second (or any signal but SIGINT after the first)
forces the stop, SIGKILL at once; a SIGINT as the third signal kills the calls' processes from
the log and exits at once, after its ``run/summary`` (the next load repairs the log). Before the
agent exists (the log opens, the worker pool starts), the first signal cancels the opening at
once. The counts live in ``andon.cli._signals.LEDGER`` for the whole life of the process, so a
signal before the loop counts as the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andon.base import Disposed, User
from andon.cli._output import Output, say
from andon.cli._signals import LEDGER, record_only
from andon.cli._writer import drain_writers

__all__ = ["HoldingLoop", "LoopSignals"]


@dataclass
class LoopSignals:
    """What a signal does during the loop; the handlers run on the loop (never inside a callback
    of ours). The counts live in the process-wide ledger, so a signal received before the loop
    started counts as the first."""

    out: Output
    session: Path
    agent: Any = None  # the Agent once it exists
    # The task opening the agent (the log, the worker pool's start), until the agent exists: a
    # first signal cancels it at once (the pool takes down what already started) instead of
    # waiting for the whole start.
    opening: asyncio.Task[Any] | None = None
    # Prints ``run/summary`` for an exit code (set by the job): the hard exit prints it too.
    summarize: Callable[[int], None] | None = None

    @property
    def first(self) -> int | None:
        return LEDGER.first

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        LEDGER.early = False  # from here on a signal stops the run instead of unwinding main
        for signum in LEDGER.handled:
            loop.add_signal_handler(signum, self.on_signal, signum)

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        LEDGER.record(signum)
        agent = self.agent
        if LEDGER.count == 1:
            cause = User() if signum == signal.SIGINT else Disposed()
            if agent is None:
                say(f"{name}: stopping before the agent started")
                if self.opening is not None:
                    # Once only: a second cancel would cut short the clean-up the first began.
                    self.opening.cancel()
                return
            self.out.stopping(name, cause.kind)
            agent.cancel(cause)
        elif LEDGER.count == 2 or signum != signal.SIGINT:
            if agent is not None:
                self.out.forcing(name)
                agent.cancel(User(), force=True)  # the first cause stays; force kills now
            else:
                say(f"{name} again: already stopping (the worker pool's start is taken down)")
        else:
            self.hard_exit()

    def hard_exit(self) -> None:
        """Third Ctrl-C: SIGKILL the processes of every tool call still running, then exit at
        once. The workers see this process die (pidfd) and exit; the next load repairs the log.

        The calls' processes are found as crash repair finds them (their tag and start time, or
        their proven cgroup, from the log): never a bare group id, which by now may be another
        session's."""
        from andon.session import kill_in_flight, read

        killed = 0
        with contextlib.suppress(Exception):
            killed = kill_in_flight(read(self.session))
        calls = len(self.out.tracker.in_flight)
        # What really arrived (TERM, INT, INT is a third signal, not a third SIGINT).
        say(
            f"SIGINT as the third signal ({LEDGER.names()}): killed {killed} process(es) of "
            f"{calls} tool call(s); exiting now"
        )
        code = 128 + (self.first or signal.SIGINT)
        # The summary still says how the run ended (a CI step reads it); written at once, the
        # writers drained within their own bounds (os._exit runs no atexit hook).
        if self.summarize is not None:
            with contextlib.suppress(BaseException):
                self.summarize(code)
        with contextlib.suppress(Exception):
            drain_writers()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class HoldingLoop(asyncio.SelectorEventLoop):
    """The event loop of ``andon run``: when it lets go of a signal (at close), the signal goes
    to the recording handler in one swap, never through the default action.

    The base loop restores ``SIG_DFL`` (``default_int_handler`` for SIGINT) when it closes; a
    signal after that, delivered to any thread of the process (the log's sync thread, say), would
    kill andon by the default action and change its exit status after ``run/summary`` was
    printed. Blocking the signals would not help: a mask is per thread.
    """

    def remove_signal_handler(self, sig: int) -> bool:
        if sig not in LEDGER.handled:
            return super().remove_signal_handler(sig)
        signal.signal(sig, record_only)  # atomic: from the loop's handler straight to ours
        # The loop's wakeup socket is about to close; a signal must not be written to it.
        signal.set_wakeup_fd(-1)
        return True
