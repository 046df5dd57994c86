"""What a long streamed reply costs the log: ``assistant/chunk`` records and bytes per MB of reply.

    python benchmarks/bench_chunks.py [--mb 2] [--chunk-size 16] [--http] [--subscriber] [--json]

One turn through the real agent (``open_agent``, default durability) whose model streams a reply of
``--mb`` megabytes of text in fragments of ``--chunk-size`` characters, as fast as it can
(``Scripted`` in the same process, or with ``--http`` the mock model server over real HTTP through
``OpenAICompatible``). Reported, per MB of reply: ``assistant/chunk`` records, bytes of
``events.jsonl`` and seconds of wall time; with ``--subscriber`` an ``agent.events()`` subscriber
drains the stream as ``andon run`` does, and the live events it saw are counted too. A run that
has not finished after ``--timeout`` seconds is cancelled and reported as such (with what it had
written by then).

The stop latency of a streaming reply is ``andon bench interrupt --scenario stream``; run it beside
this script to see that coalescing costs the cancel nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from andon import WorkerPoolConfig, open_agent
from andon.base import User
from andon.llm import Model, OpenAICompatible, Scripted
from andon.testing import MockModelServer

MB = 1_000_000


def _reply(mb: float, chunk_size: int) -> dict[str, Any]:
    unit = "streaming a long answer, line after line.\n"  # 42 characters
    text = unit * int(mb * MB / len(unit))
    return {"text": text, "chunk_size": chunk_size}


async def _run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    reply = _reply(args.mb, args.chunk_size)
    text_bytes = len(reply["text"].encode())
    async with contextlib.AsyncExitStack() as stack:
        model: Model
        if args.http:
            server = await stack.enter_async_context(MockModelServer([reply]))
            model = await stack.enter_async_context(
                OpenAICompatible(server.base_url, "m", api_key_env=None)
            )
        else:
            model = Scripted([reply])
        agent = await stack.enter_async_context(
            open_agent(folder / "session", model=model, pool=WorkerPoolConfig(size=1))
        )
        seen: Counter[str] = Counter()
        # Subscribed here, before the turn starts (a subscriber that is never read would only
        # make its queue grow, so there is none without --subscriber).
        events = agent.events() if args.subscriber else None

        async def drain() -> None:
            assert events is not None
            async for item in events:
                seen[item.type] += 1
                if item.type == "turn/end":
                    return

        async with asyncio.TaskGroup() as tg:
            if events is not None:
                tg.create_task(drain())
            t = time.perf_counter()
            agent.followup("go")
            finished = True
            try:
                await asyncio.wait_for(agent.when_idle(), args.timeout)
            except TimeoutError:
                finished = False
                agent.cancel(User())
                await agent.when_idle()
            wall = time.perf_counter() - t
    log = folder / "session" / "events.jsonl"
    kinds: Counter[str] = Counter()
    chunk_bytes = 0
    with open(log, "rb") as f:
        for line in f:
            kind = json.loads(line)["type"]
            kinds[kind] += 1
            if kind == "assistant/chunk":
                chunk_bytes += len(line)
    size = log.stat().st_size
    per_mb = MB / text_bytes
    out: dict[str, Any] = {
        "reply_bytes": text_bytes,
        "chunk_size": args.chunk_size,
        "transport": "http" if args.http else "scripted",
        "finished": finished,
        "wall_s": round(wall, 3),
        "records": sum(kinds.values()),
        "chunk_records": kinds["assistant/chunk"],
        "log_bytes": size,
        "chunk_records_per_mb": round(kinds["assistant/chunk"] * per_mb, 1),
        "log_bytes_per_mb": round(size * per_mb),
        "chunk_bytes_per_mb": round(chunk_bytes * per_mb),
        "seconds_per_mb": round(wall * per_mb, 3),
    }
    if args.subscriber:
        out["live_events"] = dict(seen)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=2.0, help="reply size in MB (default 2)")
    p.add_argument("--chunk-size", type=int, default=16, help="characters per fragment")
    p.add_argument("--http", action="store_true", help="mock model server over HTTP")
    p.add_argument("--subscriber", action="store_true", help="drain agent.events() meanwhile")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many s")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="andon-bench-chunks-") as tmp:
        result = asyncio.run(_run(args, Path(tmp)))
    if args.json:
        print(json.dumps(result))
        return 0
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
