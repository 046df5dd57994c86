"""Process identity lives in one module: ``andon.base.procs`` is the only code that reads
``/proc/<pid>/stat`` or sends a signal to a process found by a number. Anything else that did would
be a second, unchecked way to touch a stranger."""

from __future__ import annotations

import re
from pathlib import Path

import andon

SRC = Path(andon.__file__).parent
HOME = SRC / "base" / "procs.py"

FORBIDDEN = {
    "reads /proc/<pid>/stat": re.compile(r"/stat\b"),
    "pidfd_send_signal": re.compile(r"pidfd_send_signal"),
    "os.kill / os.killpg": re.compile(r"\bos\.kill(pg)?\("),
    "psutil.Process": re.compile(r"psutil\.Process\("),
}
# ``Popen.send_signal``/``kill``/``terminate`` stay allowed: they only ever signal the caller's
# own child while it is unreaped, whose pid cannot have been reused.


def test_only_procs_names_and_signals_processes() -> None:
    offences = []
    benchmarks = SRC.parent.parent / "benchmarks"
    for path in sorted([*SRC.rglob("*.py"), *benchmarks.glob("*.py")]):
        if path == HOME:
            continue
        rel = path.relative_to(SRC if SRC in path.parents else benchmarks.parent).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    offences.append(f"{rel}:{n}: {what}: {line.strip()}")
    assert offences == []


def test_the_check_sees_an_offence() -> None:
    assert FORBIDDEN["os.kill / os.killpg"].search("    os.killpg(pgid, signal.SIGKILL)")
    assert FORBIDDEN["reads /proc/<pid>/stat"].search('open(f"/proc/{pid}/stat")')
    assert HOME.is_file() and "def stat(" in HOME.read_text()
