"""A tool that kills its own worker, before or right after ``started`` could be sent, under CPU
load: when the result is written, nothing of the call is alive, and the result says what happened.

The supervisor knows the call's tag (and, in cgroup mode, its cgroup) before the spawn, so it can
stop the call's processes without ever hearing from the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from andon.base import AbortController, ErrorCode
from andon.supervisor import ToolCallRequest
from tests.support import call_entry, leftovers
from tests.workers.pytools import more_tools
from tests.workers.support import MODES, bash, running_pool

# Each trial costs a worker restart (a few hundred ms under load): 10 per case in the suite;
# ANDON_TEST_TRIALS=100 runs the full count.
TRIALS = int(os.environ.get("ANDON_TEST_TRIALS", "10"))


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two busy processes for the length of the test: the scheduler then interleaves the
    worker, its tool and the supervisor in less friendly orders."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()  # our own unreaped child: its pid is still ours
            hog.wait()


def _request(kind: str, call_id: str) -> ToolCallRequest:
    if kind == "python":
        return ToolCallRequest(call_id, "kills_its_worker", json.dumps({}), os.getcwd())
    # The worker is bash's parent; the sleep that follows would run for good if nobody stopped it.
    return bash(call_id, "kill -9 $PPID; exec sleep 1000")


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("cpu_load")
@pytest.mark.parametrize("kind", ["shell", "python"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_that_kills_its_worker_leaves_nothing_when_the_result_is_written(
    mode: str, kind: str
) -> None:
    async with running_pool(mode, registry=more_tools()) as (_, executor):
        for n in range(TRIALS):
            call_id = f"c1-{n + 1}-1"
            outcome = await asyncio.wait_for(
                executor.execute(_request(kind, call_id), AbortController().signal), 30
            )
            where = f"trial {n} ({mode}, {kind}): {outcome.content!r}"
            assert outcome.error is not None and outcome.error.code is ErrorCode.WORKER_LOST, where
            assert outcome.ended_by == "worker-lost", where
            assert "the worker process died" in outcome.content, where
            # No grace here: the result is written only after the call's processes are gone.
            alive = leftovers(call_entry(executor.identity, call_id), timeout=0.0)
            assert alive == [], where
