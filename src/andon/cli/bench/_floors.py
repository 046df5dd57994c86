"""Floors: the same stop done with nothing of andon in between, measured in the same run.

Every process a bare floor starts carries an environment tag (``ANDON_BENCH_TAG=…``), inherited by
children, ``setsid`` escapees and double-forked daemons alike, so what a floor leaves behind is
counted exactly (and then killed) without guessing from command lines.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx
from httpx_sse import EventSource

from andon import procs

__all__ = [
    "SUBREAPER",
    "bare_stop",
    "bare_stop_everything",
    "fsync_once",
    "httpx_close",
    "kill_tagged",
    "subreaper_argv",
    "wait_exit",
]

TAG_VAR = "ANDON_BENCH_TAG"


def kill_tagged(entry: bytes, timeout: float = 5.0) -> int:
    """SIGKILL every live process whose environment holds ``entry``; wait until all are gone.
    Returns how many there were."""
    return procs.signal_tagged(entry, signal.SIGKILL, wait=timeout)


# A child subreaper that runs a program and reaps every process of its run, for the benchmarks
# that count a whole run's CPU (startup, exit). argv: seconds to wait for the run's orphans once
# the program has exited, the tag entry (``NAME=value``: the program's environment gets it, the
# wrapper's own does not), the program. It passes a SIGINT on to the program; on stderr it says,
# one JSON line each, when it started the program and when that exited (CLOCK_MONOTONIC, the
# clock the benchmarks read) with its exit code, then, once every orphan is reaped (or the wait
# is over), the CPU time of all it reaped. The program's stdout is the wrapper's.
SUBREAPER = """
import ctypes, json, os, resource, signal, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
name, _, value = sys.argv[2].partition("=")
t0 = time.monotonic()
child = subprocess.Popen(sys.argv[3:], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, name: value})
signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
code = child.wait()
t1 = time.monotonic()
sys.stderr.write(json.dumps({"t0": t0, "exited": t1, "code": code}) + "\\n")
sys.stderr.flush()
deadline = t1 + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.005)  # sleep-ok: polling the orphans' exits, bounded by the deadline
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stderr.write(json.dumps({"cpu": usage.ru_utime + usage.ru_stime}) + "\\n")
"""


def subreaper_argv(reap_for: float, entry: bytes, argv: list[str]) -> list[str]:
    """The command that runs ``argv`` under :data:`SUBREAPER`, tagged with ``entry``."""
    return [sys.executable, "-c", SUBREAPER, str(reap_for), entry.decode(), *argv]


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until ``proc`` exits, at most ``timeout`` seconds, and reap it; False on timeout.

    Woken by the exit itself (a pidfd becomes readable), never by a poll. ``Popen.wait`` with a
    timeout sleeps between looks, 1 ms at first and doubling up to 50 ms, so an exit 40 ms after
    the signal was seen at 63 ms: it measured its own sleeps (every figure fell on 1, 3, 7, 15,
    31, 63 or 113 ms)."""
    if proc.returncode is not None:
        return True
    fd = os.pidfd_open(proc.pid)  # our own unreaped child: the pid is certainly this process
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0.0, timeout) * 1000):
            return False
    finally:
        os.close(fd)
    proc.wait()  # it has exited: this reaps it without sleeping
    return True


def default_signals() -> None:
    """Run in a floor's child before exec: SIGINT and SIGQUIT back to their defaults.

    A CI job (or any background job of a shell) may start us with them ignored, and an ignored
    disposition is inherited and cannot be undone by the shell itself; andon's workers reset them
    for every tool, so the floor must too, or its SIGINT would never stop anything."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _start(command: str, tag: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, TAG_VAR: tag}
    proc = subprocess.Popen(
        ["bash", "-c", command],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=env,
        preexec_fn=default_signals,  # only signal.signal, before exec
    )
    assert proc.stdout is not None
    buf = b""
    while b"ready" not in buf:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise RuntimeError(f"the floor's tree exited before it was ready: {command[:60]!r}")
        buf += chunk
    return proc


def _wait_bounded(proc: subprocess.Popen[bytes], command: str, timeout: float = 30.0) -> None:
    """Reap the floor's leader; a leader that outlives its last signal by ``timeout`` is a broken
    scenario, not a measurement: kill its group and say so (never hang the benchmark)."""
    if not wait_exit(proc, timeout):
        procs.killpg_pinned(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(
            f"the floor's leader ignored its signals for {timeout:.0f} s: {command[:60]!r}"
        ) from None


def bare_stop(
    command: str, signals: Sequence[tuple[int, float]], tag: str, delay: float = 0.0
) -> tuple[float, int]:
    """Start ``command`` in its own group, wait for ``ready`` (+ ``delay``), then send ``signals``
    (signal, seconds after the first) to the group and reap the leader, as a bare script would.
    Returns (seconds from the first signal to the leader reaped, tagged processes still alive)."""
    entry = f"{TAG_VAR}={tag}".encode()
    proc = _start(command, tag)
    if delay:
        time.sleep(delay)  # sleep-ok: the random moment inside the activity
    t0 = time.perf_counter()
    for sig, at in signals:
        wait = at - (time.perf_counter() - t0)
        if wait > 0 and wait_exit(proc, wait):
            break
        # The leader is our own unreaped child (proc.wait has not returned), so its group id
        # cannot have been reused.
        if not procs.killpg_pinned(proc.pid, sig):
            break
    _wait_bounded(proc, command)
    took = time.perf_counter() - t0
    assert proc.stdout is not None
    proc.stdout.close()
    left = kill_tagged(entry)
    return took, left


def bare_stop_everything(command: str, tag: str, delay: float = 0.0) -> float:
    """The fair floor for a tree: what andon must do (SIGINT to the group, reap the leader, SIGTERM
    to every process left, escapees included, wait until all are gone), with nothing in between.
    Finding the escapees is free here (the tag); andon has to find them through its containment."""
    entry = f"{TAG_VAR}={tag}".encode()
    proc = _start(command, tag)
    if delay:
        time.sleep(delay)  # sleep-ok: the random moment inside the activity
    t0 = time.perf_counter()
    procs.killpg_pinned(proc.pid, signal.SIGINT)  # our unreaped child leads the group
    _wait_bounded(proc, command)
    procs.signal_tagged(entry, signal.SIGTERM, wait=5.0)
    took = time.perf_counter() - t0
    assert proc.stdout is not None
    proc.stdout.close()
    kill_tagged(entry)
    return took


def fsync_once(path: str) -> float:
    """One append + fsync of a turn/end-sized line: what every durable stop pays at least once."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b'{"seq":1,"t":1.0,"type":"turn/end","turn":1,"kind":"aborted"}\n')
        t = time.perf_counter()
        os.fsync(fd)
        return time.perf_counter() - t
    finally:
        os.close(fd)


async def httpx_close(client: httpx.AsyncClient, url: str, chunks: int, delay: float) -> float:
    """Read ``chunks`` SSE events of a streamed reply, wait ``delay``, then time closing the
    response: the floor of stopping a model stream (docs/benchmarks.md, What the stop figures
    mean)."""
    import asyncio

    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    async with client.stream("POST", url, json=body) as response:
        events = EventSource(response).aiter_sse()
        for _ in range(chunks):
            await anext(events)
        await asyncio.sleep(delay)  # the random moment inside the activity
        started = time.perf_counter()
        await response.aclose()
        elapsed = time.perf_counter() - started
        with contextlib.suppress(Exception):
            await events.aclose()
        return elapsed
