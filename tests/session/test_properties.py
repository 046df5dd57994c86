"""Property tests: random well-formed sessions, cut anywhere, with any torn tail, always load to a
sound log that keeps every complete record, and loading again changes nothing."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from andon.base import Cause, Hook, ManualClock, User
from andon.session import (
    Blocked,
    Completed,
    EventData,
    MaxTokens,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    TurnEndReason,
    TurnFailed,
    check,
    fold_state,
    history,
    load,
    read,
)
from tests.session.helpers import WALL_START, Sim, aborted, lines_of, validate_request

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    database=None,  # nothing written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _tools(draw: st.DrawFn, sim: Sim, text: bool) -> bool:
    """A reply with tool calls and what the executor writes for them; True if the turn was
    cancelled while they ran."""
    n = draw(st.integers(1, 3))
    blocks: list[Any] = [TextBlock("Running.")] if text else []
    blocks += [ToolCallBlock(sim.call_id(i + 1), "bash", '{"command": "true"}') for i in range(n)]
    if draw(st.booleans()):
        sim.stream(blocks)
    calls = sim.reply(blocks)
    mode = draw(st.sampled_from(["sequential", "parallel", "cancel"]))
    if mode == "parallel":  # parallel-safe calls: all start, results still in model order
        for call in calls:
            sim.tool_call(call)
            sim.started(call.call_id)
        for call in calls:
            sim.result(call.call_id, "ok\n[exit code 0]")
        return False
    running = draw(st.integers(0, n - 1)) if mode == "cancel" else n
    for i, call in enumerate(calls):
        if i < running:
            sim.tool_call(call)
            if draw(st.booleans()):
                sim.started(call.call_id)
            sim.result(call.call_id, "done", exit_code=draw(st.sampled_from([0, 1, 2])))
        elif i == running:
            if draw(st.booleans()):
                sim.cancel_inbox()
            sim.tool_call(call)
            sim.started(call.call_id)
            sim.signal(call.call_id, "interrupt", 0.5, 1)
            if draw(st.booleans()):
                sim.signal(call.call_id, "term", 2.5, 1)
            sim.result(call.call_id, "partial\n[stopped]", exit_code=None, exit_signal=15)
        else:
            sim.skipped(call)  # a tool/call + ABORTED_BEFORE_DISPATCH pair
    return mode == "cancel"


@st.composite
def sessions(draw: st.DrawFn) -> list[EventData]:
    """A session as the agent loop writes one: turns, steps, claims, tool calls, cancels."""
    sim = Sim(host="a-remote-runner")  # tool processes of random logs are never on this host
    sim.start()
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 3)) == 0:
            sim.queue("queued earlier")
        if draw(st.integers(0, 4)) == 0:
            sim.cancel_inbox()  # an idle cancel discards what was queued
        if draw(st.integers(0, 6)) == 0:
            sim.resumed(repaired=False, pid=5000)
        if draw(st.integers(0, 5)) == 0:
            sim.queue("context", "next-step", "inject")
        sim.queue("do the task")
        sim.begin_turn()
        if draw(st.integers(0, 6)) == 0:  # a pre-step hook rejects the first step
            sim.claim(first_step=True)
            sim.end_turn(Blocked("pre_step:policy"))
            continue
        cancelled = False
        hit_length = False
        for number in range(draw(st.integers(1, 3))):
            sim.begin_step(sim.claim(first_step=number == 0))
            sim.request()
            if draw(st.integers(0, 4)) == 0:
                sim.retry(1, "SERVER", "HTTP 500 from the model API", 0.2, 500)
                sim.request(attempt=2)
            if draw(st.integers(0, 4)) == 0:
                sim.queue("steer this", "next-step", "steer")
            kind = draw(st.sampled_from(["text", "tools", "tools", "prefix", "thinking", "length"]))
            thinking = [ReasoningBlock("thinking")] if draw(st.booleans()) else []
            if kind == "text":
                blocks = [*thinking, TextBlock("Here you are.")]
                sim.stream(blocks)
                sim.reply(blocks)
            elif kind == "tools":
                cancelled = _tools(draw, sim, text=draw(st.booleans()))
            elif kind == "prefix":  # cancelled mid-stream with visible text
                blocks = [*thinking, TextBlock("Partial ans")]
                sim.stream(blocks)
                sim.reply(blocks, interrupted=True)
                cancelled = True
            elif kind == "thinking":  # cancelled while only reasoning (or nothing) had streamed
                if draw(st.booleans()):
                    sim.stream([ReasoningBlock("hmm")])
                    sim.reply([ReasoningBlock("hmm")], interrupted=True)
                cancelled = True
            else:
                blocks = [TextBlock("Cut short")]
                sim.reply(blocks, "length", dropped=draw(st.integers(0, 2)))
                hit_length = True
            sim.end_step()
            if cancelled:
                break
        reason: TurnEndReason
        if cancelled:
            causes: list[Cause] = [User(), Hook("turn budget exceeded")]
            cause = draw(st.sampled_from(causes))
            reason = aborted(cause)
        elif hit_length:
            reason = MaxTokens()
        else:
            ends: list[TurnEndReason] = [Completed(), TurnFailed("HTTP 500", "SERVER")]
            reason = draw(st.sampled_from(ends))
        sim.end_turn(reason)
    return sim.data()


@st.composite
def torn_tails(draw: st.DrawFn, next_line: bytes | None) -> bytes:
    kinds = ["none", "garbage", "nul-line"] + (["prefix"] if next_line else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "prefix":
        assert next_line is not None
        # anything from one byte to the whole line without its newline
        return next_line[: draw(st.integers(1, len(next_line) - 1))]
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=64).filter(lambda b: b"\n" not in b))
    if kind == "nul-line":
        return b"\0" * draw(st.integers(0, 40)) + b"\n"
    return b""


@SETTINGS
@given(sessions())
def test_generated_sessions_are_sound(events: list[EventData]) -> None:
    lines = [json.loads(line) for line in lines_of(events)]
    assert check(lines) == []
    validate_request(history(lines))
    state = fold_state(lines)
    assert state.open_turn is None and state.open_step is None


@SETTINGS
@given(st.data())
def test_a_cut_log_with_any_torn_tail_loads_sound_and_loads_again_unchanged(
    data: st.DataObject,
) -> None:
    events = data.draw(sessions())
    lines = lines_of(events)
    cut = data.draw(st.integers(0, len(lines)))
    torn = data.draw(torn_tails(lines[cut] if cut < len(lines) else None))
    kept = [json.loads(line) for line in lines[:cut]]
    assert check(kept, live=True) == []  # every prefix of a sound log is a sound live log

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "s"
        folder.mkdir()
        log = folder / "events.jsonl"
        log.write_bytes(b"".join(lines[:cut]) + torn)
        clock = ManualClock(start=0.0, wall_start=WALL_START + 10_000.0)

        loaded = load(folder, clock=clock)

        assert [r.to_dict() for r in loaded.events[:cut]] == kept  # nothing complete is lost
        assert check(loaded.events) == []
        validate_request(history(loaded.events))
        balanced = fold_state(kept).open_turn is None
        assert loaded.repaired == (bool(torn) or not balanced)
        saved = sorted(folder.glob("events.jsonl.torn-*"))
        if torn:
            assert [p.name for p in saved] == [f"events.jsonl.torn-{sum(map(len, lines[:cut]))}"]
            assert saved[0].read_bytes() == torn
        else:
            assert saved == []
        assert all(r.synthetic == "repair" for r in loaded.events[cut:])
        assert [r.to_dict() for r in read(folder)] == [r.to_dict() for r in loaded.events]

        after = log.read_bytes()
        again = load(folder, clock=clock)
        assert not again.repaired and again.closers == ()
        assert log.read_bytes() == after
