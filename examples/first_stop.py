"""A first look at andon, offline: a scripted model asks for a long build, andon runs it in a
worker, and we pull the cord half-way through.

Run it with ``python examples/first_stop.py``. It prints the model's streamed reply, the build's
output as it arrives, then the stop: which stages were sent, how the build ended, and the
``tool/result`` record andon would log. Nothing it started is left running afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from andon import AbortController, GracePolicy
from andon.cancel import User
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.llm import ModelRequest, Scripted, TextDelta, ToolCallDelta
from andon.supervisor import ExecutionObserver, Started, ToolCallRequest, ToolExecutor
from andon.tools import default

# A "build": compiles forever, with a background indexer that ignores Ctrl-C, as real builds do.
BUILD = """
( trap '' INT; while :; do sleep 0.2; done ) &
for i in $(seq 1 1000); do echo "compiling module $i"; sleep 0.05; done
"""

SCRIPT = [
    {
        "text": "I'll run the build.",
        "tool_calls": [{"name": "bash", "arguments": {"command": BUILD}}],
        "chunk_size": 4,
        "chunk_delay": 0.02,
    }
]


class Show(ExecutionObserver):
    def __init__(self) -> None:
        self.lines = 0
        self.enough = asyncio.Event()

    def on_started(self, started: Started, worker: str = "") -> None:
        print(f"  [started pid {started.pid}, containment {started.containment}]")

    def on_output(self, call_id: str, data: bytes) -> None:
        for line in data.decode(errors="replace").splitlines():
            print(f"  | {line}")
            self.lines += 1
        if self.lines >= 8:
            self.enough.set()

    def on_signal(self, call_id: str, stage: str, at: float, targets: int) -> None:
        print(f"  [{stage}: {targets} process(es) at +{at:.3f}s]")


async def main() -> int:
    model = Scripted(SCRIPT)
    turn = AbortController()
    text, arguments, name = "", "", ""

    async def on_attempt(n: int, error: object, delay: object) -> None:
        print(f"model request, attempt {n}")

    print("assistant: ", end="", flush=True)
    async for chunk in model.stream(ModelRequest(messages=()), turn.signal, on_attempt):
        if isinstance(chunk, TextDelta):
            text += chunk.text
            print(chunk.text, end="", flush=True)
        elif isinstance(chunk, ToolCallDelta):
            name = chunk.name or name
            arguments += chunk.arguments
    print()

    registry = default()
    with tempfile.TemporaryDirectory(prefix="andon-example-") as session:
        async with WorkerPool(WorkerPoolConfig(size=1), registry) as pool:
            executor = ToolExecutor(
                pool,
                registry,
                grace=GracePolicy(term_after=1.0, kill_after=1.0),
                session_dir=Path(session),
            )
            show = Show()
            call = asyncio.create_task(
                executor.execute(
                    ToolCallRequest("c1-1-1", name, arguments, os.getcwd()), turn.signal, show
                )
            )
            await show.enough.wait()
            print("\n>>> pulling the cord (cancel by user)")
            t = time.perf_counter()
            turn.abort(User())
            outcome = await call
            took = (time.perf_counter() - t) * 1000
        print(f">>> stopped in {took:.1f} ms\n")
        print("tool/result data as andon logs it:")
        print(json.dumps(outcome.record_data(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
