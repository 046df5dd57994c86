"""Recovery benchmark (docs/benchmarks.md, The recovery figures; ``--max-events`` caps the sizes).

For logs of 10^3, 10^4, 10^5 and 10^6 events, each ending in a crash (an open turn with a tool call
that was running), it measures in a fresh process:

* cold ``load`` (read, parse, repair: torn-free here, closers appended, fsync) and ``history`` over
  the loaded events: time and peak memory (the loaded events are held, as ``load`` returns them);
* streaming folds over ``iter_records(dir)``: ``history`` (whose result is itself proportional to
  the log) and ``fold_state`` + ``fold_consumed_work`` (whose results are small): time and peak
  memory, which must not grow with the file when only a fold is needed;
* the slope: microseconds per event at each size (constant = linear);
* with and without the index of a long log (docs/log-format.md, The index of a long log), each on
  a fresh copy of the crashed log: what ``andon check`` reads (``summarize``), ``andon repair``
  (``repair``), and ``andon resume`` before its first model request (read and check the log, the
  dry-run repair that decides whether it can go on, then the open: repair under the lock, the
  records the agent's history needs read, and that history built), each with wall time, CPU
  time and peak memory. "no index" starts without the file; "index" with a valid one that an
  earlier check left.

The logs compact as a real long session must (every :data:`COMPACT_EVERY` turns), so a resumed
agent reads the log from the last compaction's cut on; the full loads read every record.

Then append throughput per durability mode (``none``, ``barrier`` with a barrier at each turn end
and before each tool dispatch, as the agent does, and ``every-record``).

Peak memory is the child's peak RSS (``VmHWM``) minus that of a child that only imported andon.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from andon.base import User
from andon.session import (
    INDEX_MIN_BYTES,
    INDEX_NAME,
    AssistantChunk,
    AssistantMessage,
    AssistantReply,
    Completed,
    ContextCompacted,
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
    repair,
    summarize,
)

SIZES = (1_000, 10_000, 100_000, 1_000_000)
MODEL = ModelInfo("deepseek-v4-flash", "deepseek", "deepseek-v4-flash")
OUTPUT = "".join(f"cc -O2 -Wall -c src/mod{i:02d}.c -o build/mod{i:02d}.o\n" for i in range(6))


COMPACT_EVERY = 64
"""A long session compacts as a real one must: about every 64 of these turns (some 1,400 records,
100k tokens of history) for a 128k-token window."""


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


def _events(count: int, *, compact: bool = True) -> list[EventData]:
    """About ``count`` events: turns (every :data:`COMPACT_EVERY`-th compacting, keeping from the
    turn before's second step, as the agent would), then a crash in the middle of a tool call."""
    out: list[EventData] = [
        SessionStart(1, "s-000000bench", "0.1.0", 1.0, "/tmp", MODEL, "prompt", 1, "bench-host")
    ]
    n = 0
    kept_from = -1  # the seq of the last turn's second step/start
    while len(out) < count - 12:
        n += 1
        turn = _turn(n)
        if compact and n % COMPACT_EVERY == 0:
            summary = f"Turns 1 to {n - 1}: the build was fixed and the tests pass. " * 8
            window = 131_072
            compacted = ContextCompacted(
                kept_from, summary, 250, 100_000, 9_000, window, MODEL.name, None, n, 1
            )
            turn.insert(5, compacted)  # after the step's user message, before its request
        kept_from = len(out) + next(
            i for i, d in enumerate(turn) if isinstance(d, StepStart) and d.step == 2
        )
        out.extend(turn)
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


def _resume(folder: Path) -> bool:
    """What ``andon resume`` does before its first model request, less starting workers and
    writing ``session/resumed``; whether the first read came from the index."""
    from andon.cli._setup import read_existing, refuse_invalid

    existing = read_existing(folder)
    refuse_invalid(existing)
    # As andon.open_agent opens it: only the records the history needs are read.
    with SessionLog.open(folder, durability="none", keep="history") as log:
        kept = [r for r in log.loaded.events if r.type != "assistant/chunk"]  # the agent's
        history(kept)  # the first request's messages
        del kept
    return existing.summary.indexed


def _child(mode: str, folder: str) -> None:
    """Runs in a fresh process; prints one JSON line."""
    result: dict[str, Any] = {}
    c0 = time.process_time()
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
    elif mode == "check":
        t0 = time.perf_counter()
        summary = summarize(folder)
        result = {"seconds": time.perf_counter() - t0, "indexed": summary.indexed}
    elif mode == "repair":
        t0 = time.perf_counter()
        report = repair(folder)
        result = {"seconds": time.perf_counter() - t0, "repaired": report.repaired}
    elif mode == "resume":
        t0 = time.perf_counter()
        indexed = _resume(Path(folder))
        result = {"seconds": time.perf_counter() - t0, "indexed": indexed}
    result["cpu_s"] = time.process_time() - c0
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
        # The cold load runs on a copy: it repairs the log, and the index rows want it crashed.
        cold = _run_child("load", Path(_copy(folder, tmp / "load")))
        stream = _run_child("stream-history", folder)
        fold = _run_child("stream-fold", folder)
        total = cold["load_s"] + cold["history_s"]
        rows.append(
            {
                "events": count,
                "file_mib": round(mib, 1),
                "load_repair_s": round(cold["load_s"], 4),
                "history_s": round(cold["history_s"], 4),
                "cpu_s": round(cold["cpu_s"], 3),
                "us_per_event": round(total / count * 1e6, 2),
                "peak_mb_load": round(max(0.0, cold["maxrss_mb"] - baseline), 1),
                "stream_history_s": round(stream["seconds"], 4),
                "peak_mb_history": round(max(0.0, stream["maxrss_mb"] - baseline), 1),
                "stream_folds_s": round(fold["seconds"], 4),
                "folds_cpu_s": round(fold["cpu_s"], 3),
                "peak_mb_folds": round(max(0.0, fold["maxrss_mb"] - baseline), 1),
                "repaired": cold["repaired"],
            }
        )
        shutil.rmtree(tmp / "load")
    return rows


def _copy(folder: Path, to: Path, *, index: bool = False) -> str:
    """A fresh copy of a session folder, with or without its index."""
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(folder, to)
    if not index:
        (to / INDEX_NAME).unlink(missing_ok=True)
    return str(to)


def _indexed(counts: dict[int, int], tmp: Path) -> list[dict[str, Any]]:
    """check, repair and resume of each crashed log (``log-<size>``, ``counts[size]`` events),
    without and with its index."""
    baseline = _run_child("baseline", tmp)["maxrss_mb"]
    rows = []
    for size, count in counts.items():
        folder = tmp / f"log-{size}"
        # A check of the crashed log leaves the index every "index" row starts from.
        _run_child("check", folder)
        for index in (False, True):
            row: dict[str, Any] = {"events": count, "index": "index" if index else "no index"}
            for mode in ("check", "repair", "resume"):
                result = _run_child(mode, Path(_copy(folder, tmp / "run", index=index)))
                row[f"{mode}_s"] = round(result["seconds"], 3)
                row[f"{mode}_cpu_s"] = round(result["cpu_s"], 3)
                row[f"{mode}_peak_mb"] = round(max(0.0, result["maxrss_mb"] - baseline), 1)
                if mode == "check":
                    row["used"] = result["indexed"]  # only a log past INDEX_MIN_BYTES has one
            rows.append(row)
        shutil.rmtree(tmp / "run", ignore_errors=True)
    return rows


def _throughput(tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for mode, turns in (("none", 2000), ("barrier", 2000), ("every-record", 200)):
        folder = tmp / f"append-{mode}"
        events = _events(turns * 21, compact=False)

        async def run(
            events: list[EventData] = events, folder: Path = folder, mode: Any = mode
        ) -> tuple[float, float]:
            log = SessionLog.open(folder, durability=mode)
            t0, c0 = time.perf_counter(), time.process_time()
            for data in events:
                log.append(data)
                # the agent's durable barriers: before a tool is dispatched, and at every turn/end
                if isinstance(data, ToolCall | TurnEnd):
                    await log.barrier()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            await log.aclose()
            return elapsed, cpu

        elapsed, cpu = asyncio.run(run())
        rows.append(
            {
                "durability": mode,
                "appends": len(events),
                "seconds": round(elapsed, 3),
                "cpu_s": round(cpu, 3),  # this process, the fsync thread included
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
        progress("recovery", 0, 3)
        recovery = _recovery(sizes, Path(tmp))
        progress("recovery", 1, 3)
        counts = {size: row["events"] for size, row in zip(sizes, recovery, strict=True)}
        indexed = _indexed(counts, Path(tmp))
        progress("recovery", 2, 3)
        throughput = _throughput(Path(tmp))
    slopes = [r["us_per_event"] for r in recovery]
    text = "\n".join(
        [
            "cold load + repair + history (fresh process per size; peak MB above an idle andon)",
            _table(recovery),
            f"slope: {min(slopes)}..{max(slopes)} us/event across sizes (constant = linear)",
            "",
            "check, repair and resume (up to the first model request) of the crashed log, "
            "without and with its index",
            _table(indexed),
            f"(used: the index was valid and used; a log under {INDEX_MIN_BYTES >> 20} MiB gets "
            "none; seconds are wall time, cpu_s user + system time of the process)",
            "",
            "append throughput per durability mode",
            _table(throughput),
            f"(fsync on this machine: see the every-record row; host {os.uname().nodename})",
        ]
    )
    return {"recovery": recovery, "index": indexed, "append": throughput}, text


if __name__ == "__main__":  # the fresh child process of one measurement
    _child(sys.argv[1], sys.argv[2])
