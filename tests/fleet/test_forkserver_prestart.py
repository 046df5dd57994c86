"""A forkserver started ahead (``ForkserverLauncher.prestart``, which ``andon run`` calls first
thing): the pool takes it as it is, replaces it when the pool must hide a variable it holds, and
one that no pool took is stopped on request (docs/workers.md, Starting workers)."""

from __future__ import annotations

import os

import pytest

from andon.fleet import ForkserverLauncher, WorkerPool, WorkerPoolConfig, _forkserver
from andon.workers import default


def _environ_of(pid: int) -> set[str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return {e.partition(b"=")[0].decode() for e in f.read().split(b"\0") if e}


def _gone(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # reaped: not our child any more
    return False


async def test_a_pool_takes_the_forkserver_started_ahead() -> None:
    ForkserverLauncher.prestart({"ANDON_API_KEY"})
    ahead = _forkserver._forkserver_pid()
    assert ahead is not None
    async with WorkerPool(WorkerPoolConfig(size=1), default(), hide_env={"ANDON_API_KEY"}):
        assert _forkserver._forkserver_pid() == ahead  # the same process forked the worker
    assert _gone(ahead)  # and the pool's close stopped it, as its own


async def test_a_forkserver_that_holds_what_the_pool_hides_is_replaced_not_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRESTART_TEST_KEY", "secret")
    ForkserverLauncher.prestart(set())  # exec'd with PRESTART_TEST_KEY
    ahead = _forkserver._forkserver_pid()
    assert ahead is not None and "PRESTART_TEST_KEY" in _environ_of(ahead)
    hidden = {"PRESTART_TEST_KEY"}
    async with WorkerPool(WorkerPoolConfig(size=1), default(), hide_env=hidden):
        now = _forkserver._forkserver_pid()
        assert now is not None and now != ahead  # it had forked nothing: replaced
        assert "PRESTART_TEST_KEY" not in _environ_of(now)
    assert _gone(ahead)


def test_a_forkserver_no_pool_took_is_stopped_on_request() -> None:
    ForkserverLauncher.prestart(set())
    ahead = _forkserver._forkserver_pid()
    assert ahead is not None
    ForkserverLauncher.stop_unused()
    assert _forkserver._forkserver_pid() is None and _gone(ahead)
