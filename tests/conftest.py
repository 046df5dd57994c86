"""Test-wide rules: every test has a timeout that ends it (tests/_limits.py: async tests run on a
fresh event loop within it, and a watchdog ends a test process that outlives it), and no test may
leave a process behind.

Leftover detection tags every process this test run starts through an environment variable
(inherited by children, grandchildren and escapees that re-parent away with ``setsid`` or a double
fork) and looks for the tag in ``/proc/*/environ`` after each test and at the end of the session.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from andon.base import procs
from andon.base.procs import ProcInfo
from tests._limits import (  # noqa: F401 (hooks, found by name)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_pyfunc_call,
    pytest_runtest_protocol,
)
from tests.support import RUN_ENTRY, alive_after, tagged_processes


def _describe(found: list[ProcInfo]) -> str:
    lines = []
    for p in found:
        try:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmdline = "(gone)"
        lines.append(f"  pid {p.pid} (ppid {p.ppid}): {cmdline[:200]}")
    return "\n".join(lines)


def _check_and_clean(when: str) -> None:
    leftovers = tagged_processes()
    if not leftovers:
        return
    # A process that is on its way out (killed, not yet reaped) gets a bounded moment to finish.
    alive = alive_after(leftovers, timeout=3.0)
    if not alive:
        return
    report = _describe(alive)
    # Clean up so that one leak does not fail every later test; only this run's tag is touched.
    procs.signal_tagged(RUN_ENTRY, signal.SIGKILL, wait=3.0)
    pytest.fail(f"{when} left {len(alive)} process(es) running:\n{report}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    _check_and_clean(f"test {request.node.nodeid}")


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_processes_at_end() -> Iterator[None]:
    yield
    _check_and_clean("the test session")
