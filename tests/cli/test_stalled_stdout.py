"""A stdout that nobody reads must not freeze the supervisor.

``andon run … | less`` on its first screen, a terminal paused with Ctrl-S, a back-pressuring log
shipper: the reader stops reading and a write to the pipe blocks. The supervisor writes stdout from
a thread through a bounded buffer, so signals, tool timeouts and the grace timeline go on; past the
bound whole lines are dropped and counted, and the summary is still the last line once the reader
drains the pipe.

Each test holds the read end of a real stdout pipe and does not read it while the run prints far
more than the pipe and the buffer hold (``seq`` through a bash tool), then checks what the run did
meanwhile from the session log and stderr, and only then drains the pipe. Readiness is a FIFO the
tool writes to and stderr lines, never a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.support import assert_balanced, finish, records, script, start

# Far more than a pipe (64 KiB) plus andon's stdout buffer (8 MiB): about 15 MB of tool output,
# printed in a few seconds.
FLOOD = "seq 1 2000000"
# About 200 KB: three times a pipe's 64 KiB, so the run's output stalls behind it.
FILL = "seq 1 30000"
# Printed by andon when the run is over and stdout still has lines to take.
EXIT_WAIT = "stdout is not being read: waiting"


def stderr_until(proc: subprocess.Popen[str], text: str) -> list[str]:
    """Read stderr lines until one contains ``text`` (the test's timeout bounds the wait)."""
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"andon ended before saying {text!r}; stderr: {seen}")


def summary_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The last line, which must be the summary; every line parsed as JSON (none cut in half)."""
    assert events, "nothing on stdout"
    assert events[-1]["type"] == "run/summary", events[-1]
    return events[-1]


@pytest.mark.timeout(120)
def test_sigterm_stops_the_run_while_stdout_is_not_read(tmp_path: Path, killer: list[Any]) -> None:
    session = tmp_path / "s"
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    # Three times what the stdout pipe holds, and little enough for the tool to finish printing it
    # whatever andon does with it; then the tool waits, to be stopped.
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Printing.",
                "tool_calls": [
                    {
                        "name": "bash",
                        "arguments": {"command": f"{FILL}; echo done > {ready}; sleep 60"},
                    }
                ],
            },
            {"text": "Stopped."},
        ],
    )
    proc = start(
        "run", "--json", "--grace", "1,1", "--model", model, "--session", str(session), "go",
        cwd=tmp_path,
    )  # fmt: skip
    killer.append(proc)
    assert ready.read_text() == "done\n"  # the tool printed it all; nobody read a byte of stdout
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    # The stop runs its course with stdout still stalled: the turn ends, durably, and andon waits
    # (bounded) for stdout at exit. Far above the expected ~1 s.
    said = "".join(stderr_until(proc, EXIT_WAIT))
    assert time.monotonic() - sent < 20
    assert "stopping (SIGTERM, cause disposed)" in said
    end = [r for r in records(session) if r["type"] == "turn/end"]
    assert [e["data"]["reason"]["reason"] for e in end] == [{"kind": "disposed"}]
    code, events, err = finish(proc, timeout=60)  # drains the pipe
    assert code == 143, err
    summary = summary_of(events)
    assert summary["exit_code"] == 143
    assert summary["ended"]["reason"] == {"kind": "disposed"}
    assert "Traceback" not in said + err
    assert_balanced(session)


@pytest.mark.timeout(120)
def test_a_tool_timeout_fires_while_stdout_is_not_read(tmp_path: Path, killer: list[Any]) -> None:
    session = tmp_path / "s"
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Flooding.",
                "tool_calls": [{"name": "bash", "arguments": {"command": FLOOD}}],
            },
            {
                "text": "Now a slow one.",
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "sleep 30", "timeout": 1}}
                ],
            },
            {"text": "It timed out."},
        ],
    )
    proc = start(
        "run", "--json", "--grace", "1,1", "--model", model, "--session", str(session), "go",
        cwd=tmp_path,
    )  # fmt: skip
    killer.append(proc)
    # The whole run (the flood, the timed-out sleep, the last reply) ends without a byte read.
    said = "".join(stderr_until(proc, EXIT_WAIT))
    results = [r["data"] for r in records(session) if r["type"] == "tool/result"]
    assert len(results) == 2
    assert results[1]["error"]["code"] == "TOOL_TIMEOUT"
    assert results[1]["duration"] < 20  # the 1 s timeout, not the 30 s sleep
    code, events, err = finish(proc, timeout=60)
    assert code == 0, err
    summary = summary_of(events)
    assert summary["exit_code"] == 0 and summary["ended"] == {"kind": "completed"}
    assert summary["tool_calls"] == 2 and summary["stdout_dropped"] > 0
    said += err
    assert "stdout is not being read: dropping whole lines" in said
    assert f"{summary['stdout_dropped']} stdout lines dropped" in said
    assert "Traceback" not in said
    assert_balanced(session)


@pytest.mark.timeout(30)
def test_past_the_bound_whole_lines_are_dropped_and_a_forced_line_kept() -> None:
    from andon.cli._writer import Writer

    r, w = os.pipe()
    writer = Writer(w, limit=4096)
    total = 5000  # ~300 KB: far more than the pipe and the bound hold while nobody reads
    for i in range(total):
        # Each line in three writes: it is kept or dropped as a whole, never cut.
        writer.write(f"{i:05d}-")
        writer.write("y" * 50)
        writer.write("\n")
    writer.write("END\n", force=True)
    got = b""
    while not got.endswith(b"END\n"):  # the test's timeout bounds the wait
        got += os.read(r, 1 << 16)
    assert writer.drain(5, 5)
    lines = got.decode().splitlines()
    assert lines[-1] == "END"
    numbers = [int(line[:5]) for line in lines[:-1]]
    assert all(line == f"{n:05d}-{'y' * 50}" for n, line in zip(numbers, lines, strict=False))
    assert numbers == sorted(numbers)
    assert writer.dropped > 0 and len(numbers) + writer.dropped == total
    os.close(r)
    os.close(w)


@pytest.mark.timeout(30)
def test_a_reader_gone_is_reported_from_the_writer_thread() -> None:
    import threading

    from andon.cli._writer import Writer

    r, w = os.pipe()
    os.close(r)
    gone = threading.Event()
    writer = Writer(w)
    writer.on_broken(gone.set)
    writer.write("lost\n")
    assert gone.wait(10)
    assert writer.broken and writer.pending == 0
    writer.write("after\n")  # quietly nothing: the fd now points at /dev/null
    assert writer.drain(1, 1) is False
    os.close(w)
