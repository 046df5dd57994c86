"""Recovery benchmark (docs/benchmarks.md, The recovery figures; ``--max-events`` caps the sizes).

For logs of 10^3, 10^4, 10^5 and 10^6 events, each ending in a crash (an open turn with a tool call
that was running), it measures in a fresh process:

* cold ``load`` (read, parse, repair: torn-free here, closers appended, fsync) and ``history`` over
  the loaded events: time and peak memory (the loaded events are held, as ``load`` returns them);
* streaming folds over ``iter_records(dir)``: ``history`` (whose result is itself proportional to
  the log) and ``fold_state`` + ``fold_consumed_work`` (whose results are small): time and peak
  memory, which must not grow with the file when only a fold is needed;
* the slope: microseconds per event at each size (constant = linear).

Then append throughput per durability mode (``none``, ``barrier`` with a barrier at each turn end
and before each tool dispatch, as the agent does, and ``every-record``).

Peak memory is the child's peak RSS (``VmHWM``) minus that of a child that only imported andon.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from andon.base import User
from andon.session import (
    AssistantChunk,
    AssistantMessage,
    AssistantReply,
    Completed,
    EventData,
    ExitStatus,
    InboxSpliced,
    LlmRequest,
    ModelInfo,
    ReasoningBlock,
    Record,
    SessionLog,
    SessionStart,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    ToolStarted,
    TurnAborted,
    TurnEnd,
    TurnStart,
    UserMessage,
    UserMessageEntered,
    encode_line,
    fold_consumed_work,
    fold_state,
    history,
    iter_records,
    load,
)

SIZES = (1_000, 10_000, 100_000, 1_000_000)
MODEL = ModelInfo("deepseek-v4-flash", "deepseek", "deepseek-v4-flash")
OUTPUT = "".join(f"cc -O2 -Wall -c src/mod{i:02d}.c -o build/mod{i:02d}.o\n" for i in range(6))


def _turn(n: int) -> list[EventData]:
    """One realistic turn (~22 records): a tool step, then a text step."""
    msg = UserMessage(f"m-{n:012x}", f"task {n}: fix the build and run the tests")
    call = ToolCallBlock(f"c{n}-1-1", "bash", '{"command": "make -j2"}', "call_00_x")
    reply = AssistantReply((ReasoningBlock("Build first."), TextBlock("Running make."), call))
    done = AssistantReply((TextBlock("The build passes now."),))
    delta = {"type": "text", "text": "Running "}
    return [
        InboxSpliced("next-turn", 0, (msg,)),
        TurnStart(n),
        InboxSpliced("next-turn", 0, (), 1),
        StepStart(n, 1),
        UserMessageEntered(n, 1, msg),
        LlmRequest(n, 1, 1, MODEL.name),
        AssistantChunk(n, 1, 1, (delta,)),
        AssistantChunk(n, 1, 1, (delta,)),
        AssistantChunk(n, 1, 1, (delta,)),
        AssistantMessage(
            n, 1, reply, "tool_calls", {"prompt_tokens": 900, "completion_tokens": 30}
        ),
        ToolCall(n, 1, call.call_id, call.name, call.arguments),
        ToolStarted(n, 1, call.call_id, "w1", "bench-host", 4301, 4301, 1.0, "pgroup"),
        ToolResult(
            n, 1, call.call_id, OUTPUT + "[exit code 0]", False, 1.5, exit=ExitStatus(0, None)
        ),
        StepEnd(n, 1),
        StepStart(n, 2),
        LlmRequest(n, 2, 1, MODEL.name),
        AssistantChunk(n, 2, 1, (delta,)),
        AssistantChunk(n, 2, 1, (delta,)),
        AssistantMessage(n, 2, done, "stop"),
        StepEnd(n, 2),
        TurnEnd(n, Completed() if n % 7 else TurnAborted(User())),
    ]


def _events(count: int) -> list[EventData]:
    """About ``count`` events: turns, then a crash in the middle of a tool call."""
    out: list[EventData] = [
        SessionStart(1, "s-000000bench", "0.1.0", 1.0, "/tmp", MODEL, "prompt", 1, "bench-host")
    ]
    n = 0
    while len(out) < count - 12:
        n += 1
        out.extend(_turn(n))
    out.extend(_turn(n + 1)[:12])  # crashed: tool/call and tool/started, no result
    return out


def _write_log(folder: Path, count: int) -> int:
    folder.mkdir(parents=True)
    events = _events(count)
    with open(folder / "events.jsonl", "wb") as f:
        for seq, data in enumerate(events):
            f.write(encode_line(Record(seq, 1_764_661_200.0 + seq * 0.01, data)))
    return len(events)


def _maxrss_mb() -> float:
    """Peak resident memory of this process image, in MiB.

    ``VmHWM`` belongs to the memory map, which exec replaces; ``ru_maxrss`` would also count the
    pages of the (large) parent this child was forked from.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(mode: str, folder: str) -> None:
    """Runs in a fresh process; prints one JSON line."""
    result: dict[str, Any] = {}
    if mode == "load":
        t0 = time.perf_counter()
        loaded = load(folder)
        t1 = time.perf_counter()
        messages = history(loaded.events)
        t2 = time.perf_counter()
        result = {
            "load_s": t1 - t0,
            "history_s": t2 - t1,
            "repaired": loaded.repaired,
            "events": len(loaded.events),
            "messages": len(messages),
        }
    elif mode == "stream-history":
        t0 = time.perf_counter()
        messages = history(iter_records(folder))
        result = {"seconds": time.perf_counter() - t0, "messages": len(messages)}
    elif mode == "stream-fold":
        t0 = time.perf_counter()
        state = fold_state(iter_records(folder))
        fold_consumed_work(iter_records(folder))
        result = {"seconds": time.perf_counter() - t0, "last_turn": state.last_turn}
    result["maxrss_mb"] = _maxrss_mb()
    print(json.dumps(result))


def _run_child(mode: str, folder: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "andon.cli.bench._recovery", mode, str(folder)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _recovery(sizes: list[int], tmp: Path) -> list[dict[str, Any]]:
    baseline = _run_child("baseline", tmp)["maxrss_mb"]
    rows = []
    for size in sizes:
        folder = tmp / f"log-{size}"
        count = _write_log(folder, size)
        mib = (folder / "events.jsonl").stat().st_size / 2**20
        cold = _run_child("load", folder)
        stream = _run_child("stream-history", folder)
        fold = _run_child("stream-fold", folder)
        total = cold["load_s"] + cold["history_s"]
        rows.append(
            {
                "events": count,
                "file_mib": round(mib, 1),
                "load_repair_s": round(cold["load_s"], 4),
                "history_s": round(cold["history_s"], 4),
                "us_per_event": round(total / count * 1e6, 2),
                "peak_mb_load": round(max(0.0, cold["maxrss_mb"] - baseline), 1),
                "stream_history_s": round(stream["seconds"], 4),
                "peak_mb_history": round(max(0.0, stream["maxrss_mb"] - baseline), 1),
                "stream_folds_s": round(fold["seconds"], 4),
                "peak_mb_folds": round(max(0.0, fold["maxrss_mb"] - baseline), 1),
                "repaired": cold["repaired"],
            }
        )
    return rows


def _throughput(tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for mode, turns in (("none", 2000), ("barrier", 2000), ("every-record", 200)):
        folder = tmp / f"append-{mode}"
        events = _events(turns * 21)

        async def run(
            events: list[EventData] = events, folder: Path = folder, mode: Any = mode
        ) -> float:
            log = SessionLog.open(folder, durability=mode)
            t0 = time.perf_counter()
            for data in events:
                log.append(data)
                # the agent's durable barriers: before a tool is dispatched, and at every turn/end
                if isinstance(data, ToolCall | TurnEnd):
                    await log.barrier()
            elapsed = time.perf_counter() - t0
            await log.aclose()
            return elapsed

        elapsed = asyncio.run(run())
        rows.append(
            {
                "durability": mode,
                "appends": len(events),
                "seconds": round(elapsed, 3),
                "appends_per_s": round(len(events) / elapsed),
                "us_per_append": round(elapsed / len(events) * 1e6, 1),
            }
        )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True))]
    for row in rows:
        lines.append("  ".join(str(row[k]).rjust(w) for k, w in zip(keys, widths, strict=True)))
    return "\n".join(lines)


def run_recovery(max_events: int, progress: Any) -> tuple[dict[str, Any], str]:
    """Both parts; returns (the JSON object, the text tables)."""
    sizes = [s for s in SIZES if s <= max_events] or [max_events]
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        progress("recovery", 0, 2)
        recovery = _recovery(sizes, Path(tmp))
        progress("recovery", 1, 2)
        throughput = _throughput(Path(tmp))
    slopes = [r["us_per_event"] for r in recovery]
    text = "\n".join(
        [
            "cold load + repair + history (fresh process per size; peak MB above an idle andon)",
            _table(recovery),
            f"slope: {min(slopes)}..{max(slopes)} us/event across sizes (constant = linear)",
            "",
            "append throughput per durability mode",
            _table(throughput),
            f"(fsync on this machine: see the every-record row; host {os.uname().nodename})",
        ]
    )
    return {"recovery": recovery, "append": throughput}, text


if __name__ == "__main__":  # the fresh child process of one measurement
    _child(sys.argv[1], sys.argv[2])
