"""Generates the golden session logs in ``tests/data/sessions/`` (run once; kept for reference).

    python tests/session/fixture_gen.py            # writes the fixtures that do not exist yet

Each fixture is written by the real :class:`andon.session.SessionLog`, with a manual clock so the
times look like a real run. Crashes are simulated by closing the writer where the process would
have died (no closers); the torn tail and the corrupt middle are made the way a crash and a
filesystem fault make them. A fixture is **never rewritten**: a format change adds a new fixture
(docs/log-format.md), so this script refuses to touch a folder that exists.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from andon.base import ErrorCode, Hook, ManualClock, User
from andon.session import (
    Completed,
    ContextCompacted,
    ContextTrimmed,
    McpServerEvent,
    ReasoningBlock,
    Record,
    SessionLog,
    TextBlock,
    ToolCallBlock,
    encode_line,
    load,
)
from tests.session.helpers import FIXTURES, WALL_START, Sim, aborted, write_session

USAGE = {"prompt_tokens": 1812, "completion_tokens": 96}


def _bash(call_id: str, command: str, provider: str) -> ToolCallBlock:
    args = '{"command": ' + _json(command) + "}"
    return ToolCallBlock(call_id, "bash", args, provider)


def _json(text: str) -> str:
    return json.dumps(text)


def _first_turn_tool_step(sim: Sim) -> None:
    """Turn 1, step 1 of the build scenario: run make, which fails."""
    sim.request()
    blocks = [
        ReasoningBlock("The user says the CI build fails. Run it first and read the error."),
        TextBlock("I'll run the build to see the error."),
        _bash(sim.call_id(1), "make -j2 2>&1 | tail -40", "call_00_kq1x"),
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    sim.result(
        calls[0].call_id,
        "cc -O2 -Wall -c src/lexer.c -o build/lexer.o\n"
        "cc -O2 -Wall -c src/parse.c -o build/parse.o\n"
        "src/parse.c:88:5: error: implicit declaration of function 'strlcpy' "
        "[-Wimplicit-function-declaration]\n"
        "   88 |     strlcpy(buf, name, sizeof buf);\n"
        "      |     ^~~~~~~\n"
        "make: *** [Makefile:14: build/parse.o] Error 1\n"
        "[exit code 2]",
        exit_code=2,
        duration=1.84,
        output_bytes=402,
    )
    sim.end_step()


def complete(folder: Path) -> None:
    sim = Sim()
    sim.start()
    sim.queue("The CI build of this repo fails. Find out why and fix it.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    _first_turn_tool_step(sim)

    # step 2: a rate limit, a retry, then two parallel-safe reads
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    sim.retry(1, "RATE_LIMITED", "429 from the model API", 0.5, 429)
    sim.request(attempt=2)
    blocks = [
        ReasoningBlock("strlcpy is a BSD function; glibc only has it since 2.38."),
        TextBlock(
            "`strlcpy` is missing on this glibc. Let me look at the call site and the flags."
        ),
        ToolCallBlock(
            sim.call_id(1),
            "read_file",
            '{"path": "src/parse.c", "offset": 80, "limit": 16}',
            "call_01_p2a",
        ),
        ToolCallBlock(sim.call_id(2), "read_file", '{"path": "Makefile"}', "call_02_p2b"),
    ]
    sim.stream(blocks, attempt=2)
    calls = sim.reply(blocks, usage={"prompt_tokens": 2290, "completion_tokens": 120})
    for call in calls:
        sim.tool_call(call)
        sim.started(call.call_id, pid=4297, worker="w1" if call is calls[0] else "w2")
    sim.result(
        calls[0].call_id,
        "80  static int copy_name(char *dst, const char *name)\n81  {\n"
        "82      char buf[64];\n...\n88      strlcpy(buf, name, sizeof buf);\n"
        '89      return snprintf(dst, 64, "%s", buf);\n90  }',
        exit_code=None,
        ended_by=None,
        with_exit=False,
        duration=0.004,
    )
    sim.result(
        calls[1].call_id,
        "CFLAGS ?= -O2 -Wall\nbuild/%.o: src/%.c\n\t$(CC) $(CFLAGS) -c $< -o $@",
        exit_code=None,
        ended_by=None,
        with_exit=False,
        duration=0.003,
    )
    sim.end_step()

    # step 3: an edit, then the build again (exclusive calls run one after the other)
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    blocks = [
        TextBlock("I'll use snprintf, which every libc has, and rebuild."),
        ToolCallBlock(
            sim.call_id(1),
            "edit_file",
            '{"path": "src/parse.c", "old": "strlcpy(buf, name, sizeof buf);", '
            '"new": "snprintf(buf, sizeof buf, \\"%s\\", name);"}',
            "call_03_e1",
        ),
        _bash(sim.call_id(2), "make -j2", "call_04_m2"),
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage={"prompt_tokens": 2650, "completion_tokens": 88})
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id, pid=4297)
    sim.result(
        calls[0].call_id,
        "Edited src/parse.c: 1 replacement.",
        exit_code=None,
        ended_by=None,
        with_exit=False,
        duration=0.006,
    )
    sim.tool_call(calls[1])
    sim.started(calls[1].call_id)
    build_log = "".join(
        f"cc -O2 -Wall -c src/mod{i:02d}.c -o build/mod{i:02d}.o\n" for i in range(60)
    )
    build_log += "cc -o build/app build/*.o\n"
    spill = f"tool-output/{calls[1].call_id}.log"
    sim.result(
        calls[1].call_id,
        "\n".join(build_log.splitlines()[:8])
        + "\n[… 45 lines omitted; full output in "
        + spill
        + " …]\n"
        + "\n".join(build_log.splitlines()[-8:])
        + "\n[exit code 0]",
        duration=6.31,
        output_bytes=len(build_log.encode()),
        output_file=spill,
    )
    sim.end_step()

    # step 4: the final answer
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    blocks = [
        TextBlock(
            "The build passes now. `src/parse.c` called `strlcpy`, which glibc only provides "
            "since 2.38; I replaced it with an equivalent `snprintf`."
        )
    ]
    sim.stream(blocks, pieces=4)
    sim.reply(blocks, usage={"prompt_tokens": 3411, "completion_tokens": 41})
    sim.end_step()
    sim.end_turn(Completed())

    # turn 2: a follow-up
    sim.queue("Also run the unit tests.", dt=12.0)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [_bash(sim.call_id(1), "make test", "call_05_t1")]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage={"prompt_tokens": 3470, "completion_tokens": 20})
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    sim.result(calls[0].call_id, "ran 48 tests: 48 passed\n[exit code 0]", duration=3.2)
    sim.end_step()
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    blocks = [TextBlock("All 48 unit tests pass.")]
    sim.stream(blocks)
    sim.reply(blocks, usage={"prompt_tokens": 3530, "completion_tokens": 9})
    sim.end_step()
    sim.end_turn(Completed())
    write_session(folder, sim)

    out = folder / "tool-output"
    out.mkdir(mode=0o700)
    path = out / "c1-3-2.log"
    path.write_text(build_log)
    os.chmod(path, 0o600)


def cancelled_mid_stream(folder: Path) -> None:
    sim = Sim(session_id="s-5be0d1e2a7c9")
    sim.start()
    sim.queue("Write a CHANGELOG entry for the parser fix.", dt=0.3)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    prefix = [
        ReasoningBlock("A short entry under a new patch version, in the existing style."),
        TextBlock("## 1.4.1\n\n- Fix the build on glibc older than 2.38 by replacing"),
    ]
    sim.stream(prefix, pieces=5)
    # Ctrl-C: the stream is closed; the visible prefix is salvaged, the rest never arrives.
    sim.reply(prefix, interrupted=True)
    sim.end_step()
    sim.end_turn(aborted(User()))

    # a second cancel, this time by the turn budget, while only reasoning had streamed
    sim.queue("Summarize the last commit instead.", dt=20.0)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    thinking = [ReasoningBlock("Look at git log -1 first, then")]
    sim.stream(thinking, pieces=3)
    sim.reply(thinking, interrupted=True)
    sim.end_step()
    sim.end_turn(aborted(Hook("turn budget exceeded: 30.0s > 30s")))
    write_session(folder, sim)


def cancelled_mid_tool(folder: Path) -> None:
    sim = Sim(session_id="s-9c1d77e0b3a4")
    sim.start()
    sim.queue("Rebuild everything from scratch and run the tests.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        TextBlock("Cleaning and rebuilding, then the tests."),
        _bash(sim.call_id(1), "make clean && make -j2", "call_00_r1"),
        _bash(sim.call_id(2), "make test", "call_01_r2"),
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    # the user presses Ctrl-C 4.1 s into the build; make ignores SIGINT in this tree
    sim.signal(calls[0].call_id, "interrupt", 4.12, 5, dt=4.1)
    sim.signal(calls[0].call_id, "term", 6.12, 5, dt=2.0)
    sim.result(
        calls[0].call_id,
        "rm -rf build\ncc -O2 -Wall -c src/lexer.c -o build/lexer.o\n"
        "cc -O2 -Wall -c src/parse.c -o build/parse.o\n"
        "make: *** [Makefile:14: build/parse.o] Terminated\n"
        "[stopped: aborted by user; SIGINT at +0.00s, SIGTERM at +2.00s; exited with signal 15 "
        "after 2.01s]\n[andon stopped 1 background process this command left running]",
        exit_code=None,
        exit_signal=15,
        error=("Aborted", ErrorCode.ABORTED, "tool call aborted"),
        ended_by="term",
        strays=1,
        output_bytes=226,
        duration=6.13,
        dt=0.01,
    )
    # the second call was waiting for the first (exclusive): it never started
    sim.skipped(calls[1])
    sim.end_step()
    sim.end_turn(aborted(User()))
    write_session(folder, sim)


def crashed_before_tool_start(folder: Path) -> None:
    sim = Sim(session_id="s-2a8e4f6b0c13")
    sim.start()
    sim.queue("Add a .editorconfig and check the build still passes.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        TextBlock("Adding the file, then building."),
        ToolCallBlock(
            sim.call_id(1),
            "write_file",
            '{"path": ".editorconfig", "content": '
            '"root = true\\n\\n[*]\\nindent_style = space\\n"}',
            "call_00_w1",
        ),
        _bash(sim.call_id(2), "make -j2", "call_01_w2"),
    ]
    sim.stream(blocks)
    sim.reply(blocks, usage=USAGE)
    # kill -9 here: the reply is on disk, no tool/call was written, nothing was dispatched
    write_session(folder, sim)


def crashed_mid_tool(folder: Path) -> None:
    sim = Sim(session_id="s-7f3b9d2c5e81")
    sim.start()
    sim.queue("Deploy the fixed build to staging and check it is healthy.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        ReasoningBlock("Deploy first, then hit the health endpoint."),
        _bash(sim.call_id(1), "./scripts/deploy.sh staging", "call_00_d1"),
        _bash(sim.call_id(2), "curl -fsS https://staging.example.com/healthz", "call_01_d2"),
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id, pid=5120)
    # kill -9 of the supervisor 40 s into the deploy: no result, the second call never started
    write_session(folder, sim)


def crashed_mid_stream(folder: Path) -> None:
    sim = Sim(session_id="s-c04e1a9b6d22")
    sim.start()
    sim.queue("Why is the lexer test flaky?", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        TextBlock("Let me look at the test."),
        ToolCallBlock(sim.call_id(1), "read_file", '{"path": "tests/test_lexer.c"}', "call_00_f1"),
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id, pid=4297)
    sim.result(
        calls[0].call_id,
        "static void test_unicode(void) {\n    srand(time(NULL));\n    ...\n}",
        exit_code=None,
        ended_by=None,
        with_exit=False,
        duration=0.004,
    )
    sim.end_step()
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    # the reply was streaming when the process died: chunks only, no assistant/message
    sim.stream(
        [
            ReasoningBlock("The test seeds rand() with the time, so"),
            TextBlock("The test is flaky because it seeds `rand()` with the current time, so"),
        ],
        pieces=3,
    )
    write_session(folder, sim)


def torn_tail(folder: Path) -> None:
    sim = Sim(session_id="s-e61f0b8a4d57")
    sim.start()
    sim.queue("Run the benchmarks and report the numbers.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [_bash(sim.call_id(1), "make bench", "call_00_b1")]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    clock = ManualClock(start=1000.0, wall_start=WALL_START)
    write_session(folder, sim, clock=clock)
    # The process died inside the write of the result line: only its first part reached the file.
    done = Sim(session_id=sim.session_id, turn=sim.turn, step=sim.step, t0=clock.time())
    done.result(
        calls[0].call_id,
        "".join(f"bench_lex_{i:02d}    {1000 + 37 * i} ns/op\n" for i in range(40))
        + "[exit code 0]",
        duration=41.7,
        output_bytes=1200,
    )
    line = encode_line(Record(len(sim.events), clock.time() + 41.7, done.events[0][1]))
    with open(folder / "events.jsonl", "ab") as f:
        f.write(line[: len(line) * 3 // 5])


def corrupt_middle(folder: Path) -> None:
    sim = Sim(session_id="s-0d9a3e7c1b64")
    sim.start()
    sim.queue("List the files in src/.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks: list[Any] = [
        ToolCallBlock(sim.call_id(1), "list_files", '{"path": "src"}', "call_00_l1")
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id, pid=4297)
    sim.result(
        calls[0].call_id,
        "src/lexer.c\nsrc/parse.c\nsrc/main.c",
        exit_code=None,
        ended_by=None,
        with_exit=False,
        duration=0.002,
    )
    sim.end_step()
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    blocks = [TextBlock("There are three files: lexer.c, parse.c and main.c.")]
    sim.stream(blocks)
    sim.reply(blocks, usage=USAGE)
    sim.end_step()
    sim.end_turn(Completed())
    write_session(folder, sim)
    # What a filesystem fault (or a crash with delayed allocation) leaves: one line in the middle
    # turned to NUL bytes, with whole records after it. This is not a torn write.
    path = folder / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[9] = b"\0" * (len(lines[9]) - 1) + b"\n"
    path.write_bytes(b"".join(lines))


def cancel_discarded_queue(folder: Path) -> None:
    sim = Sim(session_id="s-4b7e2c9f0a35")
    sim.start()
    sim.queue("Run the full test suite.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [_bash(sim.call_id(1), "pytest -x", "call_00_q1")]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    # typed while the suite runs: a follow-up and a steer
    sim.queue("Then open a PR with the fix.", "next-turn", dt=5.0)
    sim.queue("Skip the slow tests.", "next-step", "steer", dt=2.0)
    # Ctrl-C without keep_inbox: the queue is cleared (recorded), then the turn is aborted
    sim.cancel_inbox()
    sim.signal(calls[0].call_id, "interrupt", 7.01, 3, dt=0.001)
    sim.result(
        calls[0].call_id,
        "collected 512 items\n\ntests/test_api.py ........\n!!! KeyboardInterrupt !!!\n"
        "[stopped: aborted by user; SIGINT at +0.00s; exited with code 2 after 0.32s]",
        exit_code=2,
        error=("Aborted", ErrorCode.ABORTED, "tool call aborted"),
        ended_by="interrupt",
        duration=7.33,
        dt=0.32,
    )
    sim.end_step()
    sim.end_turn(aborted(User()))

    # turn 2: cancelled with keep_inbox, so the queued follow-up stays parked ...
    sim.queue("Just run tests/unit.", dt=15.0)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [_bash(sim.call_id(1), "pytest tests/unit", "call_01_q2")]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    sim.queue("And then run the linter.", "next-turn", dt=1.5)
    sim.signal(calls[0].call_id, "interrupt", 2.4, 1, dt=0.9)
    sim.result(
        calls[0].call_id,
        "collected 130 items\n\ntests/unit/test_lexer.py ....\n!!! KeyboardInterrupt !!!\n"
        "[stopped: aborted by user; SIGINT at +0.00s; exited with code 2 after 0.05s]",
        exit_code=2,
        error=("Aborted", ErrorCode.ABORTED, "tool call aborted"),
        ended_by="interrupt",
        duration=2.45,
        dt=0.05,
    )
    sim.end_step()
    sim.end_turn(aborted(User()))
    # ... until the user cancels again while idle: the parked follow-up is discarded unrun
    sim.cancel_inbox()
    write_session(folder, sim)


def repaired_and_resumed(folder: Path) -> None:
    clock = ManualClock(start=1000.0, wall_start=WALL_START)
    sim = Sim(session_id="s-81c5f2d09e6a")
    sim.start()
    sim.queue("Upgrade the vendored zlib to 1.3.1.", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        TextBlock("Fetching the release."),
        _bash(sim.call_id(1), "curl -fsSLO https://zlib.net/zlib-1.3.1.tar.gz", "call_00_z1"),
    ]
    sim.stream(blocks)
    calls = sim.reply(blocks, usage=USAGE)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    write_session(folder, sim, clock=clock)  # kill -9 during the download

    clock.advance(95.0)  # the CI job is retried a minute and a half later
    load(folder, clock=clock)
    log = SessionLog.open(folder, clock=clock, durability="none")
    resumed = Sim(session_id=sim.session_id, turn=sim.turn, pid=6120, t0=clock.time())
    resumed.resumed(repaired=True, pid=6120)
    resumed.queue("Continue with the zlib upgrade.", dt=0.3)
    resumed.begin_turn()
    resumed.begin_step(resumed.claim(first_step=True))
    resumed.request()
    blocks = [
        TextBlock("The download was interrupted; checking what is on disk first."),
        _bash(resumed.call_id(1), "ls -l zlib-1.3.1.tar.gz && sha256sum zlib-1.3.1.tar.gz", "c2"),
    ]
    resumed.stream(blocks)
    calls = resumed.reply(blocks, usage=USAGE)
    resumed.tool_call(calls[0])
    resumed.started(calls[0].call_id)
    resumed.result(
        calls[0].call_id,
        "ls: cannot access 'zlib-1.3.1.tar.gz': No such file or directory\n[exit code 2]",
        exit_code=2,
        duration=0.01,
    )
    resumed.end_step()
    resumed.begin_step(resumed.claim(first_step=False))
    resumed.request()
    blocks = [TextBlock("Nothing was downloaded, so it is safe to fetch it again.")]
    resumed.stream(blocks)
    resumed.reply(blocks, usage=USAGE)
    resumed.end_step()
    resumed.end_turn(Completed())
    for dt, data in resumed.events:
        clock.advance(dt)
        log.append(data)
    log.close()


def compacted(folder: Path) -> None:
    """Format 2: a long build whose oldest output was stubbed, then whose history was summarised,
    inside the turn (docs/log-format.md, Compaction)."""
    sim = Sim()
    sim.start(format=2)
    sim.queue("Build the project and run the test suite; fix what fails.", dt=0.2)
    sim.begin_turn()
    build_log = "".join(f"cc -c src/m{n:03}.c -o build/m{n:03}.o\n" for n in range(120))
    for n in range(3):
        sim.begin_step(sim.claim(first_step=n == 0))
        if n == 2:
            sim.emit(ContextTrimmed(("c1-1-1",), 7010, 4020, 8000, 1, 3), 0.004)
        sim.request()
        block = _bash(sim.call_id(1), f"make -j2 part{n + 1}", f"call_0{n}_b")
        sim.stream([block])
        sim.reply([block], usage={"prompt_tokens": 2100 + 1500 * n, "completion_tokens": 30})
        sim.tool_call(block)
        sim.started(block.call_id)
        sim.result(
            block.call_id,
            build_log[:2000] + "\n[exit code 0]",
            output_bytes=len(build_log),
            output_file=f"tool-output/{block.call_id}.log",
            duration=1.5,
        )
        sim.end_step()
    sim.begin_step(sim.claim(first_step=False))
    sim.emit(
        ContextCompacted(
            len(sim.events) - 1,
            "The user asked to build and test. `make` built parts 1-3 without errors "
            "(outputs in tool-output/c1-1-1.log … c1-3-1.log). Left: run the test suite.",
            7,
            6900,
            1300,
            8000,
            "deepseek-v4-flash",
            {"prompt_tokens": 5200, "completion_tokens": 64},
            1,
            4,
        ),
        2.1,
    )
    sim.request()
    blocks = [TextBlock("All three parts build. Running the tests is next.")]
    sim.stream(blocks)
    sim.reply(blocks, usage={"prompt_tokens": 1350, "completion_tokens": 14})
    sim.end_step()
    sim.end_turn(Completed())
    write_session(folder, sim)


def mcp_servers(folder: Path) -> None:
    """Two MCP servers named at the session's start (one started, one that could not), and a call
    to a tool of the one that did (docs/log-format.md, MCP servers)."""
    sim = Sim()
    sim.start(format=2)
    sim.emit(
        McpServerEvent(
            "time",
            ("mcp-server-time", "--local-timezone", "UTC"),
            "started",
            ("time__get_current_time", "time__convert_time"),
            server_name="mcp-time",
            server_version="1.27.0",
            capabilities={"tools": {"listChanged": False}},
        ),
        0.4,
    )
    sim.emit(
        McpServerEvent(
            "broken",
            ("python3", "server.py"),
            "failed",
            reason="MCP server 'broken' exited (exit status 3) before answering initialize",
        ),
        0.1,
    )
    sim.queue("What time is it in UTC?", dt=0.2)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    block = ToolCallBlock(
        sim.call_id(1), "time__get_current_time", '{"timezone": "UTC"}', "call_00_t"
    )
    sim.stream([block])
    sim.reply([block], usage={"prompt_tokens": 900, "completion_tokens": 20})
    sim.tool_call(block)
    sim.result(
        block.call_id,
        '{"timezone": "UTC", "datetime": "2026-12-07T15:00:00+00:00", "is_dst": false}',
        exit_code=None,
        with_exit=False,
    )
    sim.end_step()
    sim.begin_step(sim.claim(first_step=False))
    sim.request()
    blocks = [TextBlock("It is 15:00 in UTC.")]
    sim.stream(blocks)
    sim.reply(blocks, usage={"prompt_tokens": 980, "completion_tokens": 9})
    sim.end_step()
    sim.end_turn(Completed())
    write_session(folder, sim)


FIXTURE_BUILDERS: dict[str, Callable[[Path], None]] = {
    "complete": complete,
    "cancelled-mid-stream": cancelled_mid_stream,
    "cancelled-mid-tool": cancelled_mid_tool,
    "crashed-before-tool-start": crashed_before_tool_start,
    "crashed-mid-tool": crashed_mid_tool,
    "crashed-mid-stream": crashed_mid_stream,
    "torn-tail": torn_tail,
    "corrupt-middle": corrupt_middle,
    "cancel-discarded-queue": cancel_discarded_queue,
    "repaired-and-resumed": repaired_and_resumed,
    "compacted": compacted,
    "mcp-servers": mcp_servers,
}


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, build in FIXTURE_BUILDERS.items():
        folder = FIXTURES / name
        if folder.exists():
            print(f"{name}: exists, left as it is (fixtures are never rewritten)")
            continue
        build(folder)
        (folder / "lock").unlink(missing_ok=True)  # a lock file is runtime state, not part of a log
        print(f"{name}: written")


if __name__ == "__main__":
    main()
