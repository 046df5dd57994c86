"""``andon bench interrupt``: cancel → durable ``turn/end`` through the real agent, per scenario,
beside the floor of the same stop measured in the same run (docs/benchmarks.md, What the stop
figures mean).

Every andon run goes through one shared worker pool and, per scenario, one session and one mock
model server (real HTTP). A run waits until the activity is under way (a chunk streamed, the model
stalled, the tool's ``ready`` line, the build started), waits a random moment drawn from a seeded
RNG, calls ``cancel(User())`` and stops the clock when ``when_idle()`` returns: the aborted
``turn/end`` is then written and fsynced. 100 ms later it counts the processes still carrying the
calls' ``ANDON_CALL_ID`` and the bytes the workspace grew by since ``turn/end``.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from andon import procs
from andon.base import GracePolicy, User, call_tag
from andon.fleet import WorkerPool
from andon.llm import OpenAICompatible
from andon.session import (
    AgentEvent,
    AssistantChunk,
    Record,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolStarted,
    TurnEnd,
)
from andon.supervisor import ToolCallRequest, ToolExecutor, open_agent
from andon.testing import SHELL_SLEEP, STUBBORN, TRAP_INT, MockModelServer, benchmark_tree
from andon.workers import ToolRegistry

from . import _floors
from ._cpu import CpuMeter
from ._stats import summary

__all__ = ["SCENARIOS", "ScenarioResult", "run_interrupt"]

SCENARIOS = (
    "stream",
    "stall",
    "coop-tool",
    "shell",
    "trap-int",
    "stubborn",
    "tree",
    "parallel",
    "build",
    "naive",
)
AFTER = 0.1  # survivors and bytes are looked at this long after turn/end
PARALLEL = 8
STREAM_REPLY: dict[str, Any] = {
    "text": "streaming a long answer " * 400,
    "chunk_size": 16,
    "chunk_delay": 0.005,
}
STALL_REPLY: dict[str, Any] = {"text": "a few words then nothing", "chunk_size": 4}
STALL_REPLY["stall_after_chunks"] = 3

Progress = Callable[[str, int, int], None]


@dataclass
class ScenarioResult:
    name: str
    latencies: list[float] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    bytes_after: list[int] = field(default_factory=list)
    ended_by: Counter[str] = field(default_factory=Counter)
    floor: list[float] = field(default_factory=list)
    floor_label: str = ""
    floor_leaves: list[int] = field(default_factory=list)
    stage_at: list[float] = field(default_factory=list)  # start of the ending stage, per run
    to_result: list[float] = field(default_factory=list)
    to_turn_end: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # andon's and its workers' CPU per stop
    floor_everything: list[float] = field(default_factory=list)  # tree: stop every process
    reference: bool = False  # naive: not andon, shows what is left without it

    def to_json(self) -> dict[str, Any]:
        lat = summary(self.latencies)
        out: dict[str, Any] = {
            "latency": lat,
            "samples": self.latencies,
            "ended_by": dict(self.ended_by),
            "survivors_max": max(self.survivors),
            "bytes_after_max": max(self.bytes_after),
            "reference": self.reference,
        }
        if self.floor:
            flo = summary(self.floor)
            out |= {
                "floor": flo,
                "floor_label": self.floor_label,
                "floor_samples": self.floor,
                "overhead_p50": lat["p50"] - flo["p50"],
                "overhead_p99": lat["p99"] - flo["p99"],
            }
        elif self.reference:
            out |= {"overhead_p50": None, "overhead_p99": None}
        else:
            beyond = [t - s for t, s in zip(self.latencies, self.stage_at, strict=True)]
            out |= {"overhead_p50": summary(beyond)["p50"], "overhead_p99": summary(beyond)["p99"]}
        if self.cpu:
            out["cpu"] = summary(self.cpu)
        if self.to_result:
            out["cancel_to_tool_result_appended"] = summary(self.to_result)
        if self.to_turn_end:
            out["cancel_to_turn_end_appended"] = summary(self.to_turn_end)
        if self.floor_everything:
            every = summary(self.floor_everything)
            out |= {
                "floor_everything": every,
                "overhead_everything_p50": lat["p50"] - every["p50"],
                "overhead_everything_p99": lat["p99"] - every["p99"],
            }
        if self.floor_leaves:
            out["floor_leaves_max"] = max(self.floor_leaves)
        return out


def workspace_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def make_c_project(root: Path, files: int = 16) -> None:
    """A small C project whose ``make -j2`` takes a second or two here (generated once per run)."""
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        funcs = "\n".join(
            f"double f{i}_{j}(double x) {{ double s = 0; for (int k = 0; k < {j + 10}; k++)"
            f" s += x * k / (k + 1.0) - s * 0.{j + 1}; return s; }}"
            for j in range(120)
        )
        (src / f"mod{i:02d}.c").write_text(f"/* generated */\n{funcs}\n")
    (src / "main.c").write_text("int main(void) { return 0; }\n")
    objs = " ".join(f"build/mod{i:02d}.o" for i in range(files))
    (root / "Makefile").write_text(
        f"all: build/app\nbuild/app: {objs} build/main.o\n\tcc -o $@ $^\n"
        "build/%.o: src/%.c\n\t@mkdir -p build\n\tcc -O2 -c $< -o $@\n"
    )


def build_command(root: Path) -> str:
    return f"cd {root} && rm -rf build && echo ready && exec make -s -j2"


@dataclass
class Bench:
    """What all scenarios share: one worker pool, the grace policy, the RNG and a scratch folder."""

    pool: WorkerPool
    registry: ToolRegistry
    grace: GracePolicy
    rng: random.Random
    tmp: Path
    runs: int
    progress: Progress

    # -- andon ------------------------------------------------------------------------------

    async def agent_runs(
        self,
        name: str,
        reply: dict[str, Any],
        ready: Callable[[AgentEvent, dict[str, int]], bool],
        delay_max: float,
        workspace: Path,
        result: ScenarioResult,
        before_run: Callable[[], None] = lambda: None,
        max_parallel: int | None = None,
    ) -> None:
        sessions = self.tmp / "sessions"
        sessions.mkdir(exist_ok=True)
        async with (
            MockModelServer([reply] * self.runs) as server,
            OpenAICompatible(server.base_url, "m", api_key_env=None) as model,
            open_agent(
                sessions / name,
                model=model,
                cwd=workspace,
                tools=self.registry,
                workers=self.pool,
                grace=self.grace,
                max_parallel=max_parallel,
            ) as agent,
        ):
            for i in range(self.runs):
                self.progress(name, i, self.runs)
                before_run()
                records: list[Record] = []
                counts: dict[str, int] = Counter()
                is_ready = asyncio.Event()
                stream = agent.events()

                async def collect(
                    stream: AsyncIterator[AgentEvent] = stream,
                    records: list[Record] = records,
                    counts: dict[str, int] = counts,
                    is_ready: asyncio.Event = is_ready,
                ) -> None:
                    async for item in stream:
                        counts[item.type] += 1
                        if isinstance(item, Record) and not isinstance(item.data, AssistantChunk):
                            records.append(item)
                        if not is_ready.is_set() and ready(item, counts):
                            is_ready.set()
                        if isinstance(item, Record) and isinstance(item.data, TurnEnd):
                            return

                async with asyncio.TaskGroup() as tg:
                    collector = tg.create_task(collect())
                    agent.followup("go")
                    await is_ready.wait()
                    await asyncio.sleep(self.rng.uniform(0, delay_max))  # a random moment
                    wall = time.time()
                    cpu = CpuMeter()
                    cpu.start(self.pool.workers.values())
                    t = time.perf_counter()
                    agent.cancel(User())
                    await agent.when_idle()
                    latency = time.perf_counter() - t
                    result.cpu.append(cpu.stop())
                    at_end = workspace_bytes(workspace)
                    await asyncio.wait_for(collector, 5)
                await asyncio.sleep(AFTER)  # docs/benchmarks.md's 100 ms: survivors, late bytes
                # Only this session's calls: a concurrent benchmark has the same call ids, but
                # its own session id, so its processes carry other tags.
                owner = agent.session_id or ""
                entries = [
                    procs.tag_entry(call_tag(owner, r.data.call_id))
                    for r in records
                    if isinstance(r.data, ToolCall)
                ]
                survivors = sum(len(procs.tagged(entry)) for entry in entries)
                result.latencies.append(latency)
                result.survivors.append(survivors)
                result.bytes_after.append(workspace_bytes(workspace) - at_end)
                ended: list[str] = [
                    r.data.ended_by or "?" for r in records if isinstance(r.data, ToolResult)
                ]
                stage = max((self._stage_at(e) for e in ended), default=0.0)
                result.ended_by.update(ended or ["model-stream"])
                result.stage_at.append(stage)
                # where the time goes: cancel -> last tool/result appended (the worker's stop,
                # reported back) and cancel -> turn/end appended (before its fsync completes)
                results_at = [r.time for r in records if isinstance(r.data, ToolResult)]
                end_at = [r.time for r in records if isinstance(r.data, TurnEnd)]
                if results_at:
                    result.to_result.append(max(results_at) - wall)
                if end_at:
                    result.to_turn_end.append(end_at[-1] - wall)
                if survivors:  # never leave a process behind, even when andon did
                    for entry in entries:
                        _floors.kill_tagged(entry)

    def _stage_at(self, ended_by: str) -> float:
        if ended_by.endswith("term"):
            return self.grace.term_after
        if ended_by.endswith("kill"):
            return self.grace.kill_at
        return 0.0

    # -- floors ------------------------------------------------------------------------------

    async def bare_floor(
        self,
        name: str,
        command: str,
        sigs: Sequence[tuple[int, float]],
        delay_max: float,
        result: ScenarioResult,
        before_run: Callable[[], None] = lambda: None,
    ) -> None:
        for i in range(self.runs):
            self.progress(f"{name} floor", i, self.runs)
            before_run()
            took, left = await asyncio.to_thread(
                _floors.bare_stop,
                command,
                sigs,
                secrets.token_hex(8),
                self.rng.uniform(0, delay_max),
            )
            result.floor.append(took)
            result.floor_leaves.append(left)

    async def stream_floor(
        self, reply: dict[str, Any], chunks: int, delay_max: float
    ) -> list[float]:
        out = []
        async with (
            MockModelServer([reply] * self.runs) as server,
            httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None)) as client,
        ):
            url = f"{server.base_url}/chat/completions"
            for _ in range(self.runs):
                delay = self.rng.uniform(0, delay_max)
                out.append(await _floors.httpx_close(client, url, chunks, delay))
        return out

    async def coop_floor(self) -> list[float]:
        """One worker round trip (a no-op tool through the same pool) + one fsync."""
        executor = ToolExecutor(self.pool, self.registry, grace=self.grace, session_dir=self.tmp)
        from andon.base import AbortController

        fsync_path = str(self.tmp / "fsync-floor")
        out = []
        for i in range(self.runs):
            req = ToolCallRequest(f"c90-1-{i + 1}", "noop", "{}", str(self.tmp))
            t = time.perf_counter()
            await executor.execute(req, AbortController().signal)
            trip = time.perf_counter() - t
            out.append(trip + _floors.fsync_once(fsync_path))
        return out


def bash(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def _tool_ready(item: AgentEvent, counts: dict[str, int]) -> bool:
    return isinstance(item, ToolOutput) and "ready" in item.text


def _unlink(path: Path) -> Callable[[], None]:
    def go() -> None:
        path.unlink(missing_ok=True)

    return go


async def scenario(bench: Bench, name: str) -> ScenarioResult:
    result = ScenarioResult(name)
    grace = bench.grace
    ws = bench.tmp / "ws" / name
    ws.mkdir(parents=True, exist_ok=True)
    ticks = ws / "ticks"
    if name == "stream":
        # ready at the first chunk; the reply streams for ~3 s, so the cancel lands mid-stream
        chunk = lambda r, c: isinstance(r, Record) and isinstance(r.data, AssistantChunk)  # noqa: E731
        await bench.agent_runs(name, STREAM_REPLY, chunk, 0.1, ws, result)
        result.floor = await bench.stream_floor(STREAM_REPLY, 1, 0.1)
        result.floor_label = "httpx stream closed"
    elif name == "stall":
        # the server sends 3 chunks then stalls: ready once the agent has seen all three (live
        # deltas; the log coalesces them into one record 16 ms later)
        stalled = lambda r, c: c["assistant/delta"] >= 3  # noqa: E731
        await bench.agent_runs(name, STALL_REPLY, stalled, 0.02, ws, result)
        result.floor = await bench.stream_floor(STALL_REPLY, 3, 0.02)
        result.floor_label = "httpx stream closed"
    elif name == "coop-tool":
        started = lambda r, c: isinstance(r, Record) and isinstance(r.data, ToolStarted)  # noqa: E731
        reply = {"tool_calls": [{"name": "coop_wait", "arguments": {"seconds": 60}}]}
        await bench.agent_runs(name, reply, started, 0.02, ws, result)
        result.floor = await bench.coop_floor()
        result.floor_label = "worker round trip + fsync"
    elif name in ("shell", "trap-int", "stubborn", "tree"):
        command, sigs = {
            "shell": (SHELL_SLEEP, [(signal.SIGINT, 0.0)]),
            "trap-int": (TRAP_INT, [(signal.SIGINT, 0.0), (signal.SIGTERM, grace.term_after)]),
            "stubborn": (
                STUBBORN,
                [
                    (signal.SIGINT, 0.0),
                    (signal.SIGTERM, grace.term_after),
                    (signal.SIGKILL, grace.kill_at),
                ],
            ),
            "tree": (benchmark_tree(str(ticks)), [(signal.SIGINT, 0.0)]),
        }[name]
        reset = _unlink(ticks)
        await bench.agent_runs(name, bash(command), _tool_ready, 0.05, ws, result, reset)
        await bench.bare_floor(name, command, sigs, 0.05, result, reset)
        result.floor_label = "bare killpg + reap" if name == "tree" else "bare signals + reap"
        reset()
        if name == "tree":
            # the fair floor: also stop every escapee and wait until all are gone, as andon does
            for i in range(bench.runs):
                bench.progress("tree floor/all", i, bench.runs)
                took = await asyncio.to_thread(
                    _floors.bare_stop_everything,
                    command,
                    secrets.token_hex(8),
                    bench.rng.uniform(0, 0.05),
                )
                result.floor_everything.append(took)
                reset()
    elif name == "parallel":
        all_started = lambda r, c: c["tool/started"] >= PARALLEL  # noqa: E731
        call = {"name": "coop_wait", "arguments": {"seconds": 60}}
        reply = {"tool_calls": [call] * PARALLEL}
        await bench.agent_runs(name, reply, all_started, 0.02, ws, result, max_parallel=PARALLEL)
    elif name == "build":
        make_c_project(ws)
        await bench.agent_runs(name, bash(build_command(ws)), _tool_ready, 0.5, ws, result)
    elif name == "naive":
        result.reference = True
        await naive(bench, benchmark_tree(str(ticks)), ws, result, _unlink(ticks))
    else:
        raise ValueError(f"unknown scenario {name!r}")
    return result


async def naive(
    bench: Bench, command: str, ws: Path, result: ScenarioResult, reset: Callable[[], None]
) -> None:
    """The same tree under a plain ``asyncio.create_subprocess_exec`` + ``terminate()``: what a
    loop without andon gets. Its processes are tagged so what it leaves can be counted."""
    for i in range(bench.runs):
        bench.progress("naive", i, bench.runs)
        reset()
        tag = f"{_floors.TAG_VAR}={secrets.token_hex(8)}"
        env = {**os.environ, _floors.TAG_VAR: tag.split("=", 1)[1]}
        # stdout is a plain pipe read in a thread: on Python 3.11 ``proc.wait()`` of an asyncio
        # subprocess also waits for its pipes to close, which the survivors keep open.
        read_end, write_end = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", command, stdout=write_end, env=env, cwd=ws
            )
        finally:
            os.close(write_end)
        buf = b""
        while b"ready" not in buf:
            chunk = await asyncio.to_thread(os.read, read_end, 4096)
            if not chunk:
                break
            buf += chunk
        await asyncio.sleep(bench.rng.uniform(0, 0.05))  # a random moment
        t = time.perf_counter()
        proc.terminate()
        await proc.wait()
        result.latencies.append(time.perf_counter() - t)
        at_end = workspace_bytes(ws)
        await asyncio.sleep(AFTER)  # the same 100 ms as for andon
        result.survivors.append(len(procs.tagged(tag.encode(), exclude=(os.getpid(),))))
        result.bytes_after.append(workspace_bytes(ws) - at_end)
        result.stage_at.append(0.0)
        result.ended_by["terminate"] += 1
        await asyncio.to_thread(_floors.kill_tagged, tag.encode())
        os.close(read_end)
    reset()


async def run_interrupt(
    names: list[str],
    runs: int,
    grace: GracePolicy,
    seed: int,
    progress: Progress,
) -> tuple[dict[str, ScenarioResult], str]:
    """Run ``names`` in order; returns the results and the pool's containment mode."""
    from andon.fleet import WorkerPoolConfig
    from andon.workers import default

    from ._tools import coop_wait, noop

    registry = default()
    registry.add(noop)
    registry.add(coop_wait)
    results: dict[str, ScenarioResult] = {}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"andon-bench-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)
    try:
        async with WorkerPool(WorkerPoolConfig(size=PARALLEL), registry) as pool:
            await pool.wait_started()  # every worker warm before the first scenario
            bench = Bench(pool, registry, grace, random.Random(seed), tmp, runs, progress)
            for name in names:
                results[name] = await scenario(bench, name)
            containment = str(pool.containment)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results, containment
