"""A hypothesis state machine drives the agent with random sends, cancels and tool durations.

After every run: the log passes every invariant, every follow-up either ran, was discarded on
purpose (a canceled splice) or is still parked in the inbox, no wake is lost (an idle agent with
queued turns must have been stopped abnormally), and nothing hangs (every wait is bounded).
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import andon
from andon.base import Aborted, AbortSignal, Disposed, GracePolicy, Hook, Parent, User
from andon.llm import (
    Chunk,
    Finish,
    ModelInfo,
    ModelRequest,
    OnAttempt,
    TextDelta,
    ToolCallDelta,
)
from andon.session import check, fold_state, read
from andon.supervisor import Agent, WorkerPool, WorkerPoolConfig
from tests.workers.pytools import registry

STEP_TIMEOUT = 30.0  # "nothing hangs": every wait is bounded far above any tool's duration


class FuzzModel:
    """An endless model: every request is a text reply or a reply with 1-3 tool calls, chosen by
    a counter (deterministic for a given sequence of requests)."""

    info = ModelInfo("fuzz", "test", "fuzz")

    def __init__(self, durations: list[float]) -> None:
        self._n = itertools.count()
        self._durations = durations

    async def stream(
        self, request: ModelRequest, signal: AbortSignal, on_attempt: OnAttempt
    ) -> AsyncIterator[Chunk]:
        await on_attempt(1, None, None)
        n = next(self._n)
        for word in ("working ", "on ", "it"):
            if signal.reason is not None:
                raise Aborted(signal.reason)
            await asyncio.sleep(0)  # sleep-ok: one tick between chunks, as a network would
            yield TextDelta(word)
        last = request.messages[-1] if request.messages else {}
        if n % 3 != 2 and last.get("role") != "tool":
            calls = 1 + n % 3
            for i in range(calls):
                seconds = self._durations[(n + i) % len(self._durations)]
                name = "cooperative" if i % 2 == 0 else "bash"
                args = (
                    f'{{"seconds": {seconds}}}'
                    if name == "cooperative"
                    else f'{{"command": "sleep {seconds}"}}'
                )
                yield ToolCallDelta(i, f"call_{n}_{i}", name, args)
            yield Finish("tool_calls")
            return
        yield Finish("stop")


class AgentMachine(RuleBasedStateMachine):
    loop: ClassVar[asyncio.AbstractEventLoop]
    pool: ClassVar[WorkerPool]

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="andon-fuzz-"))
        self.followups: list[str] = []
        self.closed = False
        self._cm: Any = None
        self.agent: Agent = self.run(self._open())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, STEP_TIMEOUT))

    def on_loop(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Sends and cancel belong on the event loop's thread, inside the running loop."""

        async def call() -> Any:
            return fn(*args, **kwargs)

        return self.run(call())

    async def _open(self) -> Agent:
        self._cm = andon.open_agent(
            self.folder,
            model=FuzzModel([0.0, 0.01, 0.03, 0.05, 0.002]),
            tools=registry(),
            workers=self.pool,
            grace=GracePolicy(term_after=0.05, kill_after=0.1),
        )
        agent: Agent = await self._cm.__aenter__()
        return agent

    @rule(text=st.sampled_from(["a", "b", "c"]))
    def followup(self, text: str) -> None:
        if not self.closed:
            self.followups.append(self.on_loop(self.agent.followup, text))

    @rule()
    def steer(self) -> None:
        if not self.closed:
            self.on_loop(self.agent.steer, "steer")

    @rule()
    def inject(self) -> None:
        if not self.closed:
            self.on_loop(self.agent.inject, "context")

    @rule(
        cause=st.sampled_from([User(), Parent(), Hook("fuzz")]),
        keep=st.booleans(),
        force=st.booleans(),
    )
    def cancel(self, cause: Any, keep: bool, force: bool) -> None:
        if not self.closed:
            self.on_loop(self.agent.cancel, cause, keep_inbox=keep, force=force)

    @rule(ticks=st.integers(min_value=1, max_value=30))
    def let_it_run(self, ticks: int) -> None:
        async def spin() -> None:
            for _ in range(ticks):
                await asyncio.sleep(0.002)  # sleep-ok: random progress between sends is the point

        self.run(spin())

    @rule()
    def wait_idle(self) -> None:
        if self.closed:
            return
        self.run(self.agent.when_idle())
        self._no_wake_lost()

    @rule()
    def dispose(self) -> None:
        if not self.closed:
            self.on_loop(self.agent.cancel, Disposed(), keep_inbox=True)
            self.run(self._close())

    async def _close(self) -> None:
        self.closed = True
        await self._cm.__aexit__(None, None, None)

    def _no_wake_lost(self) -> None:
        records = read(self.folder)
        state = fold_state(records)
        if state.next_turn:
            ends = [r.data.reason.kind for r in records if r.type == "turn/end"]  # type: ignore[union-attr]
            assert ends and ends[-1] not in ("completed", "max-tokens"), (
                f"idle with {len(state.next_turn)} queued turn(s) after a {ends[-1:]} turn"
            )

    @invariant()
    def log_is_sound_while_running(self) -> None:
        assert check(read(self.folder), live=True) == []

    def teardown(self) -> None:
        if not self.closed:
            self.run(self._close())
        records = read(self.folder)
        assert check(records) == []
        entered = {
            r.data.message.id
            for r in records
            if r.type == "user/message"  # type: ignore[union-attr]
        }
        pending = {m.id for m in fold_state(records).next_turn}
        canceled: set[str] = set()
        claimed_by: dict[str, int] = {}  # message id -> the turn that claimed it
        ends: dict[int, str] = {}
        queued: list[str] = []
        turn = 0
        for r in records:
            d: Any = r.data
            if r.type == "turn/start":
                turn = d.turn
            elif r.type == "turn/end":
                ends[d.turn] = d.reason.kind
            elif r.type == "agent/inbox/spliced" and d.target == "next-turn":
                removed = queued[d.start : d.start + d.removed]
                if d.outcome == "canceled":
                    canceled.update(removed)
                else:
                    claimed_by.update(dict.fromkeys(removed, turn))
                del queued[d.start : d.start + d.removed]
                queued[d.start : d.start] = [m.id for m in d.inserted]
        for mid in self.followups:
            if mid in entered or mid in canceled or mid in pending:
                continue
            # Claimed by a turn that stopped before its first step: the claim and that turn's
            # end are on record (the consumed-work fold reports it), never silently lost.
            assert mid in claimed_by, f"follow-up {mid} vanished"
            assert ends.get(claimed_by[mid]) in ("aborted", "blocked", "error", "interrupted")


def test_agent_state_machine() -> None:
    loop = asyncio.new_event_loop()
    try:
        pool = WorkerPool(WorkerPoolConfig(size=2, containment="subreaper"), registry())
        loop.run_until_complete(pool.start())
        AgentMachine.loop = loop
        AgentMachine.pool = pool
        try:
            run_state_machine_as_test(
                AgentMachine,
                settings=settings(
                    max_examples=300,
                    stateful_step_count=15,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        finally:
            loop.run_until_complete(pool.close())
    finally:
        loop.close()
