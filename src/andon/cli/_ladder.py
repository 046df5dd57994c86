"""The loop phase of the signal ladder (docs/ci.md, Timeouts and cancellation): what SIGINT,
SIGTERM and SIGHUP do while ``andon run`` has its event loop, and the loop that hands them back to
the recording handler when it closes.

The ladder: the first signal cancels the turn with its cause (SIGINT: ``user``; SIGTERM, SIGHUP:
``disposed``) and the grace timeline runs; a second (or any signal but SIGINT after the first)
forces the stop, SIGKILL at once; a third SIGINT kills the calls' processes from the log and
exits at once (the next load repairs the log). The counts live in ``andon.cli._signals.LEDGER``
for the whole life of the process, so a signal before the loop counts as the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andon.base import Disposed, User
from andon.cli._output import Output, say
from andon.cli._signals import LEDGER, record_only

__all__ = ["HoldingLoop", "LoopSignals"]


@dataclass
class LoopSignals:
    """What a signal does during the loop; the handlers run on the loop (never inside a callback
    of ours). The counts live in the process-wide ledger, so a signal received before the loop
    started counts as the first."""

    out: Output
    session: Path
    agent: Any = None  # the Agent once it exists

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
                return
            self.out.stopping(name, cause.kind)
            agent.cancel(cause)
        elif LEDGER.count == 2 or signum != signal.SIGINT:
            if agent is not None:
                self.out.forcing(name)
                agent.cancel(User(), force=True)  # the first cause stays; force kills now
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
        say(
            f"SIGINT a third time: killed {killed} process(es) of {calls} tool call(s); exiting now"
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(128 + (self.first or signal.SIGINT))


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
