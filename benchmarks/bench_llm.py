"""Model adapter benchmarks: per-chunk overhead and abort -> stream closed, each beside its floor.

    python benchmarks/bench_llm.py [--runs 30] [--chunks 400] [--json]

The mock model server runs in its own process (``andon mock-model``'s ``main``), so the server's
work does not share the measured event loop. Every figure is measured in the same run as its
floor:

* per chunk: a reply of ``--chunks`` text chunks read through ``OpenAICompatible.stream`` beside
  the same reply read with a bare ``httpx`` stream + ``httpx-sse`` + ``json.loads`` (the least any
  client must do). Wall time per chunk, and the client's own CPU time per chunk (``thread_time``
  of the loop's thread: independent of how fast the server writes), with the adapter's overhead.
* abort -> stream closed: a stream that sent two chunks and then stalls. For the adapter, from
  ``controller.abort()`` to the consumer's ``async for`` raising ``Aborted`` (the response is
  closed by then); the floor is ``await response.aclose()`` on a bare httpx stream in the same
  state (docs/benchmarks.md, What the stop figures mean), and, as a second floor,
  cancelling a task blocked reading that bare stream and then closing it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource

from _stats import summary, table
from andon.base import AbortController, Aborted, ModelError, User
from andon.llm import Finish, ModelRequest, OpenAICompatible

REQUEST = ModelRequest(messages=({"role": "user", "content": "benchmark"},))
BODY = {"model": "bench", "stream": True, "messages": list(REQUEST.messages)}
WARMUP = 3


async def _no_log(n: int, error: ModelError | None, delay: float | None) -> None:
    return None


def _script(runs: int, chunks: int) -> list[dict[str, Any]]:
    """Replies in the exact order the benchmark sends requests."""
    long = {
        "text": "abcd" * chunks,
        "chunk_size": 4,
        "usage": {"prompt_tokens": 1, "completion_tokens": chunks},
    }
    stall = {"text": "abcdef", "chunk_size": 2, "stall_after_chunks": 2}
    return [long, long, stall, stall, stall] * (runs + WARMUP)


class _Server:
    def __init__(self, script: Path) -> None:
        code = "import sys; from andon.testing import mock_model_main; sys.exit(mock_model_main())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--script", str(script)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            self.stop()
            raise RuntimeError("the mock model server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


async def _adapter_reply(model: OpenAICompatible) -> tuple[float, float, int]:
    cpu, wall, n = time.thread_time(), time.perf_counter(), 0
    last: object = None
    async for chunk in model.stream(REQUEST, AbortController().signal, _no_log):
        n += 1
        last = chunk
    assert isinstance(last, Finish)
    return time.perf_counter() - wall, time.thread_time() - cpu, n


async def _raw_reply(client: httpx.AsyncClient, url: str) -> tuple[float, float, int]:
    cpu, wall, n = time.thread_time(), time.perf_counter(), 0
    async with client.stream("POST", url, json=BODY) as response:
        async for event in EventSource(response).aiter_sse():
            if event.data == "[DONE]":
                continue  # read on to the end of the body, as the adapter does
            json.loads(event.data)
            n += 1
    return time.perf_counter() - wall, time.thread_time() - cpu, n


async def _adapter_abort(model: OpenAICompatible) -> float:
    controller = AbortController()
    two = asyncio.Event()
    ended: list[float] = []

    async def consume() -> None:
        seen = 0
        try:
            async for _ in model.stream(REQUEST, controller.signal, _no_log):
                seen += 1
                if seen == 2:
                    two.set()
        except Aborted:
            ended.append(time.perf_counter())

    task = asyncio.create_task(consume())
    await two.wait()
    await asyncio.sleep(0.002)  # let the consumer block on the stalled stream
    started = time.perf_counter()
    controller.abort(User())
    await task
    return ended[0] - started


async def _raw_abort(client: httpx.AsyncClient, url: str) -> float:
    async with client.stream("POST", url, json=BODY) as response:
        events = EventSource(response).aiter_sse()
        for _ in range(2):
            await anext(events)
        await asyncio.sleep(0.002)  # the same stalled state as the adapter's run
        started = time.perf_counter()
        await response.aclose()
        elapsed = time.perf_counter() - started
        await events.aclose()
        return elapsed


async def _raw_cancel_read(client: httpx.AsyncClient, url: str) -> float:
    """A second floor: a task blocked reading the stalled stream is cancelled, then the response
    is closed; what any client that reads in one task and aborts from another must do."""
    async with client.stream("POST", url, json=BODY) as response:
        events = EventSource(response).aiter_sse()
        for _ in range(2):
            await anext(events)
        reader = asyncio.create_task(anext(events))
        await asyncio.sleep(0.002)  # the reader is now blocked on the stalled socket
        started = time.perf_counter()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await response.aclose()
        elapsed = time.perf_counter() - started
        await events.aclose()
        return elapsed


async def _bench(base_url: str, runs: int) -> dict[str, list[float]]:
    url = f"{base_url}/chat/completions"
    out: dict[str, list[float]] = {
        k: [] for k in ("wall", "wall_raw", "cpu", "cpu_raw", "abort", "abort_raw", "abort_task")
    }
    async with (
        OpenAICompatible(base_url, "bench", api_key_env=None) as model,
        httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None)) as client,
    ):
        for run in range(runs + WARMUP):
            wall, cpu, n = await _adapter_reply(model)
            wall_raw, cpu_raw, n_raw = await _raw_reply(client, url)
            abort = await _adapter_abort(model)
            abort_raw = await _raw_abort(client, url)
            abort_task = await _raw_cancel_read(client, url)
            if run < WARMUP:
                continue
            # The adapter's chunks include Usage and Finish; the raw count includes the finish
            # event: compare per content chunk of the same reply.
            out["wall"].append(wall / (n - 2))
            out["cpu"].append(cpu / (n - 2))
            out["wall_raw"].append(wall_raw / (n_raw - 1))
            out["cpu_raw"].append(cpu_raw / (n_raw - 1))
            out["abort"].append(abort)
            out["abort_raw"].append(abort_raw)
            out["abort_task"].append(abort_task)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--chunks", type=int, default=400, help="text chunks per reply")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(_script(args.runs, args.chunks)))
        server = _Server(script)
        try:
            samples = asyncio.run(_bench(server.base_url, args.runs))
        finally:
            server.stop()

    def us(values: list[float]) -> dict[str, float]:
        return {k: (v if k == "n" else v * 1e6) for k, v in summary(values).items()}

    overhead = {
        "wall": [a - b for a, b in zip(samples["wall"], samples["wall_raw"], strict=True)],
        "cpu": [a - b for a, b in zip(samples["cpu"], samples["cpu_raw"], strict=True)],
        "abort": [a - b for a, b in zip(samples["abort"], samples["abort_raw"], strict=True)],
    }
    result = {
        "runs": args.runs,
        "chunks_per_reply": args.chunks,
        "per_chunk_us": {
            "adapter_wall": us(samples["wall"]),
            "httpx_wall": us(samples["wall_raw"]),
            "overhead_wall": us(overhead["wall"]),
            "adapter_cpu": us(samples["cpu"]),
            "httpx_cpu": us(samples["cpu_raw"]),
            "overhead_cpu": us(overhead["cpu"]),
        },
        "abort_to_closed_us": {
            "adapter": us(samples["abort"]),
            "httpx_aclose": us(samples["abort_raw"]),
            "httpx_cancel_read_aclose": us(samples["abort_task"]),
            "overhead_vs_aclose": us(overhead["abort"]),
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    rows = []
    for group, figures in (
        ("per chunk", result["per_chunk_us"]),
        ("abort -> closed", result["abort_to_closed_us"]),
    ):
        for name, stats in figures.items():
            rows.append(
                [group, name, f"{stats['p50']:.1f}", f"{stats['p99']:.1f}", f"{stats['max']:.1f}"]
            )
    print(f"{args.runs} runs, {args.chunks} chunks per reply; microseconds")
    print(table(["figure", "measure", "p50", "p99", "max"], rows))


if __name__ == "__main__":
    main()
