"""Workers that break the protocol on purpose, as a buggy or hostile worker would: each is
andon's own worker (``andon.workers.Worker``) with one fault, run by
``andon.workers.worker_main(options, fault)``.

A faulty worker is started by a test's launcher (tests/faulty_launcher.py), never by an option
of andon's: a forked worker unpickles its program by reference, so this module is imported in
it, and imports nothing but the worker layer.
"""

from __future__ import annotations

import asyncio
import os

from andon.protocol import ErrorReply, Message, Result, Started
from andon.workers import Worker

__all__ = [
    "ErrorBeforeResult",
    "ExitBeforeHello",
    "GarbageAfterStarted",
    "NoHello",
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
