"""Python tools used by the worker tests (importable, so workers load them by reference)."""

from __future__ import annotations

import asyncio
import os
import time

import andon.tools
from andon.base import AbortSignal


@andon.tools.tool(parallel_safe=True)
async def cooperative(seconds: float, *, signal: AbortSignal) -> str:
    """Waits, but stops as soon as its signal aborts."""
    waiter = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait_for(asyncio.shield(waiter), seconds)
    except TimeoutError:
        return "finished"
    finally:
        waiter.cancel()
    signal.throw_if_aborted()
    return "unreachable"


@andon.tools.tool
def stubborn_sync(seconds: float) -> str:
    """Ignores any signal: only killing its worker stops it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)  # sleep-ok: this tool deliberately ignores cancellation
    return "done"


@andon.tools.tool
def env_probe(name: str) -> str:
    """Returns an environment variable as the tool sees it."""
    return os.environ.get(name, "<unset>")


@andon.tools.tool
def fails(message: str) -> str:
    raise RuntimeError(message)


@andon.tools.tool
def echo_pid() -> str:
    return str(os.getpid())


@andon.tools.tool
async def send_garbage() -> str:
    """Makes its own worker break the protocol, as a buggy or hostile worker might."""
    from andon.workers import _main

    worker = _main._ACTIVE
    assert worker is not None and worker._sock is not None
    await worker._sock.send_multipart([b"\xc1 not msgpack", b"\x00"])
    await asyncio.sleep(30)  # sleep-ok: waits to be killed by the supervisor
    return "not reached"


def registry() -> andon.tools.ToolRegistry:
    reg = andon.tools.default()
    for t in (cooperative, stubborn_sync, env_probe, fails, echo_pid, send_garbage):
        reg.add(t)
    return reg
