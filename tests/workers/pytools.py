"""Python tools used by the worker tests (importable, so workers load them by reference)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import andon.tools
from andon.base import AbortSignal


@andon.tools.tool(parallel_safe=True)
async def cooperative(seconds: float, *, signal: AbortSignal) -> str:
    """Waits, but stops as soon as its signal aborts."""
    waiter = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait_for(asyncio.shield(waiter), seconds)
    except TimeoutError:
        return "finished"
    finally:
        waiter.cancel()
    signal.throw_if_aborted()
    return "unreachable"


@andon.tools.tool
def stubborn_sync(seconds: float) -> str:
    """Ignores any signal: only killing its worker stops it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)  # sleep-ok: this tool deliberately ignores cancellation
    return "done"


@andon.tools.tool
def env_probe(name: str) -> str:
    """Returns an environment variable as the tool sees it."""
    return os.environ.get(name, "<unset>")


@andon.tools.tool
def fails(message: str) -> str:
    raise RuntimeError(message)


@andon.tools.tool
def echo_pid() -> str:
    return str(os.getpid())


def registry() -> andon.tools.ToolRegistry:
    reg = andon.tools.default()
    for t in (cooperative, stubborn_sync, env_probe, fails, echo_pid):
        reg.add(t)
    return reg


@andon.tools.tool
async def exit_statuses() -> str:
    """Children that exit 3, waited three ways: a stolen status would read 0 (or 255)."""
    import subprocess

    plain = subprocess.run(["sh", "-c", "exit 3"], check=False).returncode
    captured = subprocess.run(["sh", "-c", "exit 3"], capture_output=True, check=False).returncode
    proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
    waited = await proc.wait()
    return f"{plain},{captured},{waited}"


@andon.tools.tool
async def leaves_things(mode: str, ready: str = "", *, signal: AbortSignal) -> str:
    """Starts a setsid child, a thread and an asyncio task that would all run for minutes, then
    returns (``mode='return'``), waits for its signal (``'cooperate'``) or ignores it and SIGTERM
    (``'ignore'``; then it says so on the FIFO ``ready``)."""
    import subprocess
    import threading

    subprocess.Popen(["setsid", "sleep", "300"], start_new_session=True)
    threading.Thread(target=time.sleep, args=(300,), daemon=False).start()
    left = asyncio.sleep(300)  # sleep-ok: a task the tool leaves behind, to die with the process
    asyncio.get_running_loop().create_task(left)
    if mode == "return":
        return "left"
    if mode == "cooperate":
        await signal.wait()
        signal.throw_if_aborted()
    import signal as _signal

    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)  # only SIGKILL ends it
    if ready:
        with open(ready, "w") as f:  # a FIFO: the test waits on it, not on time
            f.write("deaf\n")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.01)  # noqa: ASYNC251  # sleep-ok: blocks its own loop, deaf to its signal
    return "unreachable"


@andon.tools.tool
async def reason_probe(path: str, ready: str = "", *, signal: AbortSignal) -> str:
    """Says it runs on the FIFO ``ready``, writes the reason its signal aborted with to
    ``path``, then stops as asked."""
    if ready:
        with open(ready, "w") as f:
            f.write("running\n")
    cause = await signal.wait()
    with open(path, "w") as f:
        f.write(cause.describe())
    signal.throw_if_aborted()
    return "unreachable"


@andon.tools.tool
def kills_its_worker() -> str:
    """Kills the worker that runs it, at once (a model's ``pkill python``, the OOM killer)."""
    import signal as _signal

    os.kill(os.getppid(), _signal.SIGKILL)
    time.sleep(300)  # sleep-ok: waits to be killed with its call
    return "unreachable"


@andon.tools.tool
def cooperative_sync(seconds: float, *, signal: AbortSignal) -> str:
    """A sync tool that checks its signal between short sleeps (it runs on the call process's
    main thread; a cancel reaches it as a signal handler)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        signal.throw_if_aborted()
        time.sleep(0.01)  # sleep-ok: a sync tool's own work, checking its signal in between
    return "finished"


def more_tools() -> andon.tools.ToolRegistry:
    reg = registry()
    for t in (exit_statuses, leaves_things, reason_probe, kills_its_worker, cooperative_sync):
        reg.add(t)
    return reg


@andon.tools.tool
def takes_data(data: dict) -> str:  # type: ignore[type-arg]
    """Takes any JSON object; says how many keys it has."""
    return str(len(data))


def data_tools() -> andon.tools.ToolRegistry:
    reg = more_tools()
    reg.add(takes_data)
    return reg


@andon.tools.tool
def fails_at_length(size: int) -> str:
    """Raises with a message of ``size`` characters."""
    raise RuntimeError("x" * size)


@andon.tools.tool
def returns_escaped() -> str:
    """Returns what ``os.fsdecode`` makes of a Latin-1 name: a str with a surrogate escape."""
    return "found " + os.fsdecode(b"caf\xe9") + " and \ud800"


@andon.tools.tool
def raises_escaped() -> str:
    """Raises with a surrogate escape in its message (an OSError about such a file does)."""
    raise FileNotFoundError(os.fsdecode(b"no caf\xe9 here"))


def bytes_tools() -> andon.tools.ToolRegistry:
    reg = registry()
    for t in (fails_at_length, returns_escaped, raises_escaped):
        reg.add(t)
    return reg


@andon.tools.tool
def where_am_i() -> str:
    """Says which process runs it: pid, group, cgroup, call id, and whether ``/proc`` shows the
    call's tag in its environment block."""
    from andon import procs

    tag = os.environ.get(procs.TAG_VAR, "")
    return json.dumps(
        {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "cgroup": Path("/proc/self/cgroup").read_text().strip(),
            "call_id": os.environ.get("ANDON_CALL_ID"),
            "tagged": procs.carries(os.getpid(), procs.tag_entry(tag)),
        }
    )


@andon.tools.tool
async def marks_then_cooperates(marker: str, *, signal: AbortSignal) -> str:
    """Creates ``marker`` as its first line (a test learns from it that the tool ran at all),
    then waits for its signal (bounded)."""
    Path(marker).touch()
    await asyncio.wait_for(signal.wait(), 60)
    signal.throw_if_aborted()
    return "unreachable"


@andon.tools.tool
def marks_then_cooperates_sync(marker: str, *, signal: AbortSignal) -> str:
    """The same, as a sync tool (a cancel reaches it as SIGIO)."""
    Path(marker).touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        signal.throw_if_aborted()
        time.sleep(0.01)  # sleep-ok: a sync tool's own work, checking its signal in between
    return "finished"


@andon.tools.tool
def closes_its_pipes(ready: str) -> str:
    """Closes every descriptor but 0-2 (its pipes to the worker among them: a cancel written now
    finds the pipe broken while the process still runs), says so on the FIFO ``ready``, then
    waits to be stopped by a signal."""
    os.closerange(3, 4096)
    with open(ready, "w") as f:
        f.write("closed\n")
    time.sleep(300)  # sleep-ok: waits to be stopped with its call
    return "unreachable"


def spare_tools() -> andon.tools.ToolRegistry:
    reg = data_tools()
    for t in (where_am_i, marks_then_cooperates, marks_then_cooperates_sync, closes_its_pipes):
        reg.add(t)
    return reg
