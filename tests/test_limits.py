"""The suite's time limits end every kind of stuck test (tests/_limits.py): each case runs a real
pytest, with this suite's limits as its plugin, on a test that would wait forever, and the run
must end, failed, well inside its own bound."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._limits import EXIT_HUNG

ROOT = Path(__file__).resolve().parent.parent
BOUND = 90.0
"""How long one inner run may take before this test gives up on it (the limits below end it in a
few seconds; the bound only keeps a broken mechanism from hanging this suite in turn)."""


def _run(
    tmp_path: Path, body: str, timeout: float = 1.0, backstop: float = 3.0
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_stuck.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests._limits",
            "-o",
            f"timeout={timeout}",
            "-o",
            f"timeout_backstop={backstop}",
            "test_stuck.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


@pytest.mark.timeout(120)
def test_an_async_test_waiting_forever_fails_at_its_timeout(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        """
        import asyncio

        async def test_waits() -> None:
            await asyncio.Event().wait()
        """,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout >1s: the test was still waiting in its event loop" in run.stdout
    assert "in test_waits" in run.stdout  # where it waited
    assert "1 failed" in run.stdout


@pytest.mark.timeout(120)
def test_a_timeout_swallowed_by_a_background_task_still_ends_the_test(tmp_path: Path) -> None:
    # What hung CI: the main task waits for a task that catches every BaseException, the way
    # asyncio.Task itself keeps a pytest-timeout Failed raised inside a coroutine step.
    run = _run(
        tmp_path,
        """
        import asyncio

        async def swallow() -> None:
            while True:
                try:
                    await asyncio.Event().wait()
                except BaseException:
                    pass

        async def test_waits_on_a_stubborn_task() -> None:
            await asyncio.shield(asyncio.ensure_future(swallow()))
        """,
        backstop=15.0,  # past the clean-up's bound: the stubborn task is given up on
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout >1s" in run.stdout
    assert "ignored their cancellation" not in run.stdout  # the timeout is what is reported
    assert "1 failed" in run.stdout


@pytest.mark.timeout(120)
def test_a_left_task_that_ignores_cancellation_fails_the_test_instead_of_hanging(
    tmp_path: Path,
) -> None:
    run = _run(
        tmp_path,
        """
        import asyncio

        async def stubborn() -> None:
            while True:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    pass

        async def test_leaves_a_task() -> None:
            asyncio.ensure_future(stubborn())
            await asyncio.sleep(0)  # sleep-ok: one turn of the loop, so the task starts
        """,
        timeout=30.0,
        backstop=15.0,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the test left tasks that ignored their cancellation" in run.stdout
    assert "stubborn" in run.stdout


@pytest.mark.timeout(120)
def test_a_test_that_swallows_every_interruption_ends_its_process(tmp_path: Path) -> None:
    # Neither the loop's cancel nor the alarm can end this one: the watchdog does, naming it.
    run = _run(
        tmp_path,
        """
        import time

        def test_never_gives_up() -> None:
            while True:
                try:
                    time.sleep(0.05)  # sleep-ok: a test that ignores its timeout on purpose
                except BaseException:
                    pass
        """,
    )
    assert run.returncode == EXIT_HUNG, run.stdout + run.stderr
    assert "test_never_gives_up outlived its timeout (1s) by 3s" in run.stderr
    assert "test_never_gives_up" in run.stderr.split("stacks:", 1)[1]


@pytest.mark.timeout(120)
def test_an_async_test_whose_loop_is_blocked_ends_its_process(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        """
        import time

        async def test_blocks_the_loop() -> None:
            while True:
                try:
                    time.sleep(0.05)  # sleep-ok: a loop blocked on purpose
                except BaseException:
                    pass
        """,
    )
    assert run.returncode == EXIT_HUNG, run.stdout + run.stderr
    assert "test_blocks_the_loop outlived its timeout" in run.stderr


async def test_a_wait_for_output_the_call_can_no_longer_send_fails_at_once() -> None:
    # A worker test waiting for "ready" from a call that already ended (an error, a lost worker)
    # would otherwise wait for its timeout, or, before the limits above, forever.
    from andon.base import executor_id
    from tests.workers.support import bash, running_pool, start

    async with running_pool("subreaper", identity=executor_id()) as (_, executor):
        task, rec, _ = await start(executor, bash("c1-1-1", "echo not-what-it-waits-for; exit 3"))
        with pytest.raises(AssertionError, match="the call ended before what the test waits for"):
            await rec.wait_output()
        assert (await task).exit_code == 3
