"""Child processes for the session tests (run as a script: ``python _child.py MODE DIR ...``).

Modes:

* ``append-loop DIR SEED``: write a session, turn after turn, forever; after each append returns,
  report its seq on stdout (one line per record). The parent SIGKILLs it at a random moment.
* ``zygote``: fork ``append-loop`` writers on request (see :func:`zygote`).
* ``hold-lock DIR``: open the session (taking its lock), say ``locked`` and wait for stdin to close.
* ``fsize DIR HEADROOM BIG``: open a session, start a turn with a running tool call, then limit the
  file size (``RLIMIT_FSIZE``, SIGXFSZ ignored, so writes fail with EFBIG) to the current size plus
  HEADROOM bytes and append a result of BIG bytes. Reports what happened as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from andon.base import LogWriteFailed
from andon.session import Completed, SessionLog, TextBlock, ToolCallBlock
from tests.session.helpers import Sim


def append_loop(folder: str, seed: int, out: int = 1) -> None:
    rng = random.Random(seed)
    log = SessionLog.open(folder)

    def put(data: object) -> None:
        record = log.append(data)  # type: ignore[arg-type]
        os.write(out, b"%d\n" % record.seq)  # reported only after append returned

    sim = Sim()
    sim.start()
    for _, data in sim.events:
        put(data)

    async def turns() -> None:
        while True:
            s = Sim(turn=sim.turn)
            s.queue(f"task {sim.turn + 1}")
            s.begin_turn()
            s.begin_step(s.claim(first_step=True))
            s.request()
            n = rng.randint(0, 3)
            blocks = [TextBlock("working")] + [
                ToolCallBlock(s.call_id(i + 1), "bash", '{"command": "true"}') for i in range(n)
            ]
            s.stream(blocks)
            calls = s.reply(blocks)
            for call in calls:
                s.tool_call(call)
                s.started(call.call_id)
                s.result(call.call_id, "x" * rng.randint(0, 3000) + "\n[exit code 0]")
            s.end_step()
            s.end_turn(Completed())
            for _, data in s.events:
                put(data)
                if data.record_type == "tool/call":
                    await log.barrier()  # as the executor does before dispatching
            sim.turn = s.turn
            await log.barrier()

    asyncio.run(turns())


def zygote() -> None:
    """Fork writers on request, so each one starts in microseconds with everything imported.

    Commands on stdin, answers on stdout: ``run FOLDER SEED FIFO`` forks an ``append-loop``
    writer that reports its seqs into the FIFO, and answers its pid; ``reap PID`` waits until
    that writer is fully gone (its lock released) and answers ``reaped``.
    """
    for command in sys.stdin:
        match command.split():
            case ["run", folder, seed, fifo]:
                pid = os.fork()
                if pid == 0:
                    try:
                        append_loop(folder, int(seed), os.open(fifo, os.O_WRONLY))
                    finally:
                        os._exit(1)
                print(pid, flush=True)
            case ["reap", pid]:
                os.waitpid(int(pid), 0)
                print("reaped", flush=True)
            case _:
                raise SystemExit(f"unknown command {command!r}")


def hold_lock(folder: str) -> None:
    log = SessionLog.open(folder)
    print("locked", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    log.close()


def fsize(folder: str, headroom: int, big: int) -> None:
    log = SessionLog.open(folder)
    sim = Sim()
    sim.start()
    sim.queue("Build it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    blocks = [
        ToolCallBlock(sim.call_id(1), "bash", '{"command": "make"}'),
        ToolCallBlock(sim.call_id(2), "bash", '{"command": "make test"}'),
    ]
    calls = sim.reply(blocks)
    sim.tool_call(calls[0])
    sim.started(calls[0].call_id)
    for _, data in sim.events:
        log.append(data)
    size = os.path.getsize(log.path)
    # Past the limit a write fails with EFBIG instead of killing us with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + headroom, resource.RLIM_INFINITY))
    report: dict[str, object] = {"size_before": size}
    before = len(sim.events)
    sim.result(calls[0].call_id, "y" * big + "\n[exit code 0]")
    try:
        log.append(sim.events[before][1])
        report["first"] = "appended"
    except LogWriteFailed as exc:
        report["first"] = "LogWriteFailed"
        report["errno"] = exc.errno
    try:
        sim.end_step()
        log.append(sim.events[-1][1])
        report["later"] = "appended"
    except LogWriteFailed:
        report["later"] = "LogWriteFailed"
    report["failed"] = log.failed
    try:
        log.close()
    except LogWriteFailed:
        report["close"] = "LogWriteFailed"
    print(json.dumps(report), flush=True)


def main() -> None:
    mode, *args = sys.argv[1:]
    folder, *rest = args or [""]
    if mode == "append-loop":
        append_loop(folder, int(rest[0]))
    elif mode == "zygote":
        zygote()
    elif mode == "hold-lock":
        hold_lock(folder)
    elif mode == "fsize":
        fsize(folder, int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
