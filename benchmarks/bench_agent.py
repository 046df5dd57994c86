"""Cancel -> durable turn/end through the whole agent, for the streaming, stalled and tree cases.

    python benchmarks/bench_agent.py [--runs 20] [--json]

Each run starts a turn, waits until the activity is under way (a text chunk logged, the model
stalled, the tree ready), cancels, and measures until ``when_idle()`` returns: by then the aborted
``turn/end`` is written and synced. The floor beside each figure is one fsync of the same log
(measured in the same run), which every durable stop pays at least once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import andon
from _stats import summary, table
from andon.base import GracePolicy, User
from andon.llm import Scripted
from andon.supervisor import WorkerPoolConfig
from andon.testing import benchmark_tree


async def _wait(stream: Any, predicate: Any) -> None:
    async for item in stream:
        if predicate(item):
            return


async def scenario(name: str, runs: int, folder: Path) -> list[float]:
    ticks = folder / "ticks"
    if name == "stream":
        reply: dict[str, Any] = {
            "text": "streaming a long answer " * 400,
            "chunk_size": 16,
            "chunk_delay": 0.005,
        }
        ready = lambda r: r.get("type") == "assistant/chunk"  # noqa: E731
    elif name == "stall":
        reply = {"text": "a few words then nothing", "chunk_size": 4, "stall_after_chunks": 3}
        ready = lambda r: r.get("type") == "assistant/chunk"  # noqa: E731
    else:
        reply = {
            "tool_calls": [{"name": "bash", "arguments": {"command": benchmark_tree(str(ticks))}}]
        }
        ready = lambda r: r.get("type") == "tool/output" and "ready" in r.get("text", "")  # noqa: E731
    model = Scripted([reply] * runs)
    times = []
    async with andon.open_agent(
        folder / name,
        model=model,
        pool=WorkerPoolConfig(size=1),
        grace=GracePolicy(term_after=0.2, kill_after=0.3),
    ) as agent:
        for _ in range(runs):
            if ticks.exists():
                ticks.unlink()
            stream = agent.events()
            agent.followup("go")
            await _wait(stream, ready)
            await stream.aclose()  # type: ignore[attr-defined]
            t = time.perf_counter()
            agent.cancel(User())
            await agent.when_idle()
            times.append(time.perf_counter() - t)
    return times


def fsync_floor(folder: Path, n: int) -> list[float]:
    path = folder / "fsync-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(n):
            os.write(fd, b'{"seq":1,"type":"turn/end"}\n' * 8)
            t = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    return times


async def main(runs: int, as_json: bool) -> None:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        folder = Path(tmp)
        floor = summary(fsync_floor(folder, runs))
        for name in ("stream", "stall", "tree"):
            results[name] = summary(await scenario(name, runs, folder))
        results["fsync floor"] = floor
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"cancel -> durable turn/end (ms), {runs} runs each, grace 0.2,0.3")
    rows = [
        [name, f"{s['p50'] * 1000:.2f}", f"{s['p95'] * 1000:.2f}", f"{s['max'] * 1000:.2f}"]
        for name, s in results.items()
    ]
    print(table(["case", "p50", "p95", "max"], rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.json))
