"""Workers that break the protocol on purpose, as a buggy or hostile worker would: each is
andon's own worker (``andon.workers.Worker``) with one fault, run by
``andon.workers.worker_main(options, fault)``.

A faulty worker is started by a test's launcher (tests/faulty_launcher.py), never by an option
of andon's: a forked worker unpickles its program by reference, so this module is imported in
it, and imports nothing but the worker layer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from typing import Any

from andon.protocol import ErrorReply, Message, Result, Started
from andon.workers import Worker, WorkerOptions

__all__ = [
    "ErrorBeforeResult",
    "ExitBeforeHello",
    "GarbageAfterStarted",
    "NoHello",
    "SigtermBeforeTheCallProcessIsReady",
]


class GarbageAfterStarted(Worker):
    """Frames that are no message at all, right after its call's ``started``."""

    async def send(self, msg: Message) -> None:
        await super().send(msg)
        if isinstance(msg, Started):
            assert self._sock is not None
            # No message at all, so framed by hand on purpose.
            await self._sock.send_multipart([b"\xc1 not msgpack", b"\x00"])


class ErrorBeforeResult(Worker):
    """An ``error`` about the call right before its ``result``: the supervisor must take the call
    as lost, not believe the result that follows."""

    async def send(self, msg: Message) -> None:
        if isinstance(msg, Result):
            reason = "a test fault: an error before the result"
            await super().send(ErrorReply(reason=reason, call_id=msg.call_id))
        await super().send(msg)


class NoHello(Worker):
    """Connects and never says hello, as a worker on a machine too busy to start it in time
    would: the pool's start lasts until its deadline, or until it is stopped."""

    async def say_hello(self) -> None:
        # Until the pool kills it, or the supervisor is gone (the worker watches it).
        await asyncio.Event().wait()


class ExitBeforeHello(Worker):
    """Exits 1 before its hello: a start that fails at once."""

    async def say_hello(self) -> None:
        os._exit(1)


class SigtermBeforeTheCallProcessIsReady(Worker):
    """A worker that handles SIGTERM itself, as ``andon worker`` does (it drains), and whose
    call processes (spares too) each get a SIGTERM before they have dropped its handlers: what
    a stage does that reaches a call process before its first instruction, which on a loaded
    machine may come milliseconds after the fork."""

    def __init__(self, options: WorkerOptions, *args: Any) -> None:
        super().__init__(dataclasses.replace(options, drain_on_term=True), *args)
        from andon.workers import _pycall

        forget = _pycall._forget_the_worker

        def late() -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            forget()

        _pycall._forget_the_worker = late  # in this worker only: its forks inherit it
