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

from andon import procs
from andon.procs import ProcInfo
from tests._limits import (  # noqa: F401 (hooks, found by name)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_pyfunc_call,
    pytest_runtest_protocol,
)
from tests.llamaserver import LlamaServer, LlamaServerError, why_unavailable
from tests.support import (
    RUN_ENTRY,
    alive_after,
    keep_across_tests,
    kept_pids,
    tagged_processes,
    unkeep,
)


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


def _check_and_clean(when: str, *, include_kept: bool = False) -> None:
    leftovers = tagged_processes(include_kept=include_kept)
    if not leftovers:
        return
    # A process that is on its way out (killed, not yet reaped) gets a bounded moment to finish.
    alive = alive_after(leftovers, timeout=3.0)
    if not alive:
        return
    report = _describe(alive)
    # Clean up so that one leak does not fail every later test; only this run's tag is touched,
    # and a session-long fixture's process (the model server) only at the end of the session.
    spare = () if include_kept else kept_pids()
    procs.signal_tagged(RUN_ENTRY, signal.SIGKILL, exclude=spare, wait=3.0)
    pytest.fail(f"{when} left {len(alive)} process(es) running:\n{report}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    _check_and_clean(f"test {request.node.nodeid}")


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_processes_at_end() -> Iterator[None]:
    yield
    _check_and_clean("the test session", include_kept=True)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """A real llama.cpp server (llama-cpp-python) with SmolLM2-135M-Instruct and a 2,048-token
    window, started once per test process (an xdist worker), on first use, and stopped at the end
    of the session (tests/llamaserver.py). Skipped, with the reason, where it is not installed."""
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(f"no real model server: {reason}")
    server = LlamaServer(n_ctx=2048)
    try:
        server.start()
    except LlamaServerError as e:
        pytest.fail(str(e), pytrace=False)
    key = server.key
    if key is None:
        server.stop()
        pytest.fail(f"the llama.cpp server exited at once:\n{server.output()}", pytrace=False)
    keep_across_tests(key)
    try:
        yield server
    finally:
        server.stop()
        unkeep(key)
