"""Shared pieces for the CLI tests: the real ``andon`` executable, scripted models, and reading
its ``--json`` lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ANDON = str(Path(sys.executable).parent / "andon")
LONG = "for i in $(seq 1 600); do echo step $i; sleep 0.1; done"
# Ignores SIGINT and SIGTERM (children inherit the ignored dispositions): only SIGKILL stops it.
STUBBORN = "trap '' INT TERM; for i in $(seq 1 600); do echo tick $i; sleep 0.1; done"


def script(path: Path, replies: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"replies": replies}))
    return f"script:{path}"


def long_script(tmp_path: Path, command: str = LONG) -> str:
    return script(
        tmp_path / "long.json",
        [
            {
                "text": "Building.",
                "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
            },
            {"text": "Stopped."},
        ],
    )


def env(**extra: str) -> dict[str, str]:
    out = {
        k: v for k, v in os.environ.items() if not k.startswith("ANDON_") or k == "ANDON_TEST_RUN"
    }
    out.update(extra)
    return out


def run(
    *args: str, cwd: Path, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ANDON, *args],
        cwd=cwd,
        env=environ or env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def start(
    *args: str,
    cwd: Path,
    environ: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[str]:
    """``andon ARGS`` in a session of its own (so a test may signal its whole group)."""
    return subprocess.Popen(
        [ANDON, *args],
        cwd=cwd,
        env=environ or env(),
        preexec_fn=preexec_fn,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def read_until(
    proc: subprocess.Popen[str], pred: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Read --json lines until one matches (the test's timeout bounds the wait)."""
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    for line in proc.stdout:
        event = json.loads(line)
        seen.append(event)
        if pred(event):
            return seen
    raise AssertionError(f"andon ended before the awaited event; last: {seen[-3:]}")


def is_tool_output(event: dict[str, Any]) -> bool:
    return event.get("type") == "tool/output"


def finish(
    proc: subprocess.Popen[str], timeout: float = 30
) -> tuple[int, list[dict[str, Any]], str]:
    out, err = proc.communicate(timeout=timeout)
    events = [json.loads(line) for line in out.splitlines()]
    return proc.returncode, events, err


def records(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]


def assert_balanced(session: Path) -> None:
    check = run("check", str(session), cwd=session.parent)
    assert check.returncode == 0, check.stdout + check.stderr


SLOW_START = str(Path(__file__).with_name("slow_start.py"))
"""``andon`` whose workers never say hello (tests/cli/slow_start.py): a start that lasts."""

_HELD_PRELOAD = """
import os
os.write(2, b"preload held\\n")
with open("hold", "rb") as f:  # nobody writes: held until the process is killed
    f.read()
"""


def start_slow(
    tmp_path: Path,
    args: list[str],
    environ: dict[str, str],
    *,
    until: str,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """``andon ARGS`` whose workers never say hello (slow_start.py, in ``tmp_path``, its own
    session), returned once it said ``until`` on stderr (a test hook holds it there)."""
    proc = subprocess.Popen(
        [sys.executable, SLOW_START, *args],
        cwd=tmp_path,
        env=environ,
        stdout=stdout,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # ends at the held line, or at the process's end
        seen.append(line)
        if line.startswith(until):
            return proc
    proc.wait()
    raise AssertionError(f"never said {until!r}: {''.join(seen)}")


def start_held(
    tmp_path: Path, args: list[str], environ: dict[str, str], *, stdout: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """:func:`start_slow` with its forkserver held in its first preload module for good, as an
    import on a machine at load 50 holds it for seconds. The caller ends the process."""
    (tmp_path / "held_preload.py").write_text(_HELD_PRELOAD)
    os.mkfifo(tmp_path / "hold")
    environ = {**environ, "PRELOAD": "held_preload"}
    return start_slow(tmp_path, args, environ, until="preload held", stdout=stdout)


def signal_and_wait(
    proc: subprocess.Popen[str], signum: int, timeout: float, *, group: bool = False
) -> tuple[str, str, float]:
    """Send ``signum`` to ``proc`` (our own unreaped child, leading its own group, so the number
    is ours) and wait for its end: (stdout, stderr, seconds from the signal). Past ``timeout`` its
    group is SIGKILLed; whatever happens, nothing of it is left running."""
    try:
        sent = time.monotonic()
        if proc.poll() is None:
            (os.killpg if group else os.kill)(proc.pid, signum)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
