"""Test-wide rules: every test has a timeout, async tests run on a fresh event loop, and no test may
leave a process behind.

Leftover detection tags every process this test run starts through an environment variable
(inherited by children, grandchildren and escapees that re-parent away with ``setsid`` or a double
fork) and looks for the tag in ``/proc/*/environ`` after each test and at the end of the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import secrets
from collections.abc import Iterator

import psutil
import pytest

TAG_VAR = "ANDON_TEST_RUN"
TAG = secrets.token_hex(8)
os.environ[TAG_VAR] = TAG
_SELF = os.getpid()


def tagged_processes() -> list[psutil.Process]:
    """Live (non-zombie) processes, other than this one, that carry this run's tag."""
    needle = f"{TAG_VAR}={TAG}".encode()
    found: list[psutil.Process] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == _SELF:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
            if needle not in environ.split(b"\0"):
                continue
            proc = psutil.Process(int(entry.name))
            if proc.status() == psutil.STATUS_ZOMBIE:
                _reap_if_ours(proc.pid)
                continue
            found.append(proc)
        except (OSError, psutil.Error):
            continue  # gone meanwhile, or not readable
    return found


def _reap_if_ours(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            lines.append(f"  pid {proc.pid} (ppid {proc.ppid()}): {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            lines.append(f"  pid {proc.pid}: (gone)")
    return "\n".join(lines)


def _check_and_clean(when: str) -> None:
    leftovers = tagged_processes()
    if not leftovers:
        return
    # A process that is on its way out (killed, not yet reaped) gets a bounded moment to finish.
    _, alive = psutil.wait_procs(leftovers, timeout=3.0)
    alive = [p for p in alive if _alive(p)]
    if not alive:
        return
    report = _describe(alive)
    for proc in alive:  # clean up so that one leak does not fail every later test
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=3.0)
    pytest.fail(f"{when} left {len(alive)} process(es) running:\n{report}", pytrace=False)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    _check_and_clean(f"test {request.node.nodeid}")


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_processes_at_end() -> Iterator[None]:
    yield
    _check_and_clean("the test session")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop (no plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs), debug=False)
    return True
