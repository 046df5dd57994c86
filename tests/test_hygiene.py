"""Checks of the test suite itself: the leftover-process check can fail (it sees escapees that
re-parented), and no test orders a race with an unexplained sleep."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from andon import procs
from tests.support import alive_after, keep_across_tests, tagged_processes, unkeep


def test_leftover_check_sees_a_double_forked_escapee() -> None:
    # The subshell forks a `setsid sleep` and exits at once: the sleep re-parents away from us.
    out = subprocess.run(
        ["bash", "-c", "( setsid sleep 300 >/dev/null 2>&1 & echo $! )"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    info = procs.stat(pid)
    assert info is not None, "the escapee is already gone"
    try:
        assert info.ppid != os.getpid()
        assert pid in [p.pid for p in tagged_processes()]
    finally:
        # Not our child: reached through a pidfd verified against its start time, never a bare pid.
        assert procs.signal_key(info.key, signal.SIGKILL)
    assert alive_after([info], timeout=5.0) == []
    assert pid not in [p.pid for p in tagged_processes()]


def test_a_process_kept_across_tests_is_still_seen_at_the_end_of_the_session() -> None:
    # A session-long fixture's process (the model server) is passed over by the check after each
    # test, not by the one at the end of the session, which also sees it if its fixture forgot it.
    proc = subprocess.Popen(["sleep", "300"])
    try:
        info = procs.stat(proc.pid)
        assert info is not None
        assert proc.pid in [p.pid for p in tagged_processes()]
        keep_across_tests(info.key)
        try:
            assert proc.pid not in [p.pid for p in tagged_processes()]
            assert proc.pid in [p.pid for p in tagged_processes(include_kept=True)]
        finally:
            unkeep(info.key)
        assert proc.pid in [p.pid for p in tagged_processes()]
    finally:
        proc.kill()
        proc.wait()


# A real sleep in a test: a call of time.sleep or asyncio.sleep, or sleep imported bare from either.
_SLEEP = re.compile(r"\b(?:time|asyncio)\.sleep\(|\bfrom (?:time|asyncio) import [^#]*\bsleep\b")
_TESTS = Path(__file__).resolve().parent


def _unmarked_sleeps(text: str) -> list[tuple[int, str]]:
    """Sleeps with no ``sleep-ok: why`` on their line or in the comment lines right above."""
    lines = text.splitlines()
    found = []
    for n, line in enumerate(lines):
        if not _SLEEP.search(line.split("#", 1)[0]):
            continue
        above = n - 1
        marked = "sleep-ok" in line
        while not marked and above >= 0 and lines[above].lstrip().startswith("#"):
            marked = "sleep-ok" in lines[above]
            above -= 1
        if not marked:
            found.append((n + 1, line.strip()))
    return found


def test_every_sleep_in_the_tests_says_why_it_is_not_ordering_a_race() -> None:
    offences = [
        f"{path.relative_to(_TESTS.parent)}:{n}: {line}"
        for path in sorted(_TESTS.rglob("*.py"))
        for n, line in _unmarked_sleeps(path.read_text())
    ]
    assert offences == [], "mark each with '# sleep-ok: why' or wait on an event:\n" + "\n".join(
        offences
    )


def test_the_sleep_check_sees_an_unmarked_sleep() -> None:
    nap = "time." + "sleep"  # not written whole, or this file would be an offender itself
    sample = "\n".join(
        [
            "import time",
            f"{nap}(1)",
            "# sleep-ok: a window",
            f"{nap}(2)",
            "await asyncio." + "sleep(3)  # sleep-ok: a tick",
            "from asyncio " + "import sleep",
            "print('sleep 60')",
        ]
    )
    assert [n for n, _ in _unmarked_sleeps(sample)] == [2, 6]
