"""Python tools the benchmark registers (importable, so workers load them by reference)."""

from __future__ import annotations

import asyncio

from andon.base import AbortSignal
from andon.workers import tool

__all__ = ["coop_wait", "noop"]


@tool(parallel_safe=True)
def noop() -> str:
    """Returns at once: the dispatch floor."""
    return ""


@tool(parallel_safe=True)
async def coop_wait(seconds: float, *, signal: AbortSignal) -> str:
    """Waits up to ``seconds``, but returns as soon as its signal aborts (a cooperative tool)."""
    try:
        await asyncio.wait_for(signal.wait(), seconds)
    except TimeoutError:
        return "finished"
    signal.throw_if_aborted()
    return "unreachable"
