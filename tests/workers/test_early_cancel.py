"""A cancel is never lost, whenever it lands.

Purely cooperative policy (``term_after=inf``): a lost interrupt would let the call run on (logged
as a success) or leave it hanging, since no SIGTERM follows. Each moment is hit on purpose: by a
seeded number of event-loop turns between the start of ``execute`` and the abort (before the
worker has the ``run``, between the ``run`` and the spawn, during the spawn), and by the
executor's own callbacks (right after ``started``, at the first output).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random

import pytest

from andon.base import AbortController, ErrorCode, GracePolicy, User
from andon.supervisor import ToolCallRequest, ToolOutcome
from tests.workers.pytools import more_tools
from tests.workers.support import Recorder, bash, call_processes, running_pool

TRIALS = 100
COOPERATIVE = GracePolicy(term_after=math.inf, kill_after=1.0)


class _AbortAt(Recorder):
    """Aborts its call the moment the executor reports ``started`` or the first output."""

    def __init__(self, controller: AbortController, moment: str) -> None:
        super().__init__()
        self.controller = controller
        self.moment = moment

    def on_started(self, started: object, worker: str = "") -> None:
        super().on_started(started, worker)  # type: ignore[arg-type]
        if self.moment == "started":
            self.controller.abort(User())

    def on_output(self, call_id: str, data: bytes) -> None:
        super().on_output(call_id, data)
        if self.moment == "output":
            self.controller.abort(User())


def _request(kind: str, moment: str, call_id: str) -> ToolCallRequest:
    if kind in ("python", "python-sync"):
        name = "cooperative" if kind == "python" else "cooperative_sync"
        return ToolCallRequest(call_id, name, json.dumps({"seconds": 60}), os.getcwd())
    return bash(call_id, "exec yes line" if moment == "output" else "exec sleep 1000")


async def _one(
    executor: object, kind: str, moment: str, call_id: str, turns: int
) -> tuple[ToolOutcome, list[str]]:
    controller = AbortController()
    rec = _AbortAt(controller, moment)
    task = asyncio.create_task(
        executor.execute(_request(kind, moment, call_id), controller.signal, rec)  # type: ignore[attr-defined]
    )
    if moment == "early":
        for _ in range(turns):
            await asyncio.sleep(0)  # sleep-ok: one event-loop turn each, an ordering not a delay
        controller.abort(User())
    return await task, rec.stages


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("kind", "moment"),
    [
        ("shell", "early"),
        ("shell", "started"),
        ("shell", "output"),
        ("python", "early"),
        ("python", "started"),
        ("python-sync", "early"),
        ("python-sync", "started"),
    ],
)
async def test_a_cancel_at_any_moment_ends_the_call_promptly_and_honestly(
    kind: str, moment: str
) -> None:
    rng = random.Random(f"{kind}-{moment}")
    ended: dict[str, int] = {}
    async with running_pool("subreaper", registry=more_tools(), grace=COOPERATIVE) as (
        pool,
        executor,
    ):
        workers = dict(pool.workers)
        # How many loop turns the spawn takes depends on the machine's load: the range doubles
        # after each call cancelled before its spawn until one lands after it (bounded: 2**16
        # idle turns are well under a second).
        most = 40
        # The first trials walk the boundary one turn at a time from 0 (an abort before
        # ``execute`` even runs), so the side where the abort wins is always tried, however few
        # turns a loaded machine's dispatch takes; the rest are seeded.
        early = [0, 1, 2, 3, 4]
        for n in range(TRIALS):
            call_id = f"c1-{n + 1}-1"
            turns = early.pop(0) if early else rng.randrange(0, most)
            outcome, stages = await asyncio.wait_for(
                _one(executor, kind, moment, call_id, turns), 30
            )
            if outcome.ended_by == "not-run" and "interrupt" not in ended:
                most = min(most * 2, 1 << 16)
            where = f"trial {n} ({kind}, {moment}): {outcome.content!r}"
            assert outcome.error is not None, where
            assert outcome.error.code in (
                ErrorCode.ABORTED,
                ErrorCode.ABORTED_BEFORE_DISPATCH,
            ), where
            assert outcome.ended_by in ("interrupt", "not-run"), where
            assert "term" not in stages and "kill" not in stages, where
            ended[outcome.ended_by] = ended.get(outcome.ended_by, 0) + 1
        assert dict(pool.workers) == workers  # no worker was lost or replaced
        for n in range(TRIALS):
            assert call_processes(executor, f"c1-{n + 1}-1") == []
    if moment == "early":
        # The seeded turns must have hit both sides of the spawn, or the test proves little.
        assert ended.get("not-run", 0) > 0 and ended.get("interrupt", 0) > 0, ended
