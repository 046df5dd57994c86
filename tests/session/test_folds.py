"""Folds: history, consumed work, state, and the transcript a person reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from andon.base import ManualClock, User
from andon.session import (
    Blocked,
    Completed,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    TurnFailed,
    fold_consumed_work,
    fold_state,
    history,
    iter_records,
    load,
    read,
    render_transcript,
)
from tests.session.helpers import FIXTURES, Sim, aborted, copy_fixture, lines_of, validate_request


def _dicts(sim: Sim) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines_of(sim.data())]


def _loaded(name: str, tmp_path: Path) -> list[Any]:
    return load(copy_fixture(name, tmp_path), clock=ManualClock(wall_start=1_764_670_000.0)).events


# --- history ------------------------------------------------------------------------------------


def test_history_of_the_complete_fixture(tmp_path: Path) -> None:
    messages = history(read(FIXTURES / "complete"))
    validate_request(messages)
    assert [m["role"] for m in messages] == [
        "user",
        "assistant", "tool",
        "assistant", "tool", "tool",
        "assistant", "tool", "tool",
        "assistant",
        "user",
        "assistant", "tool",
        "assistant",
    ]  # fmt: skip
    assert messages[0] == {
        "role": "user",
        "content": "The CI build of this repo fails. Find out why and fix it.",
    }
    first = messages[1]
    assert first["content"] == "I'll run the build to see the error."
    assert first["reasoning_content"].startswith("The user says the CI build fails.")
    assert first["tool_calls"] == [
        {
            "id": "c1-1-1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "make -j2 2>&1 | tail -40"}'},
        }
    ]
    assert messages[2]["tool_call_id"] == "c1-1-1"
    assert messages[2]["content"].endswith("[exit code 2]")
    # a reply that only calls tools has content None; a plain answer has no tool_calls key
    assert messages[11]["content"] is None and "tool_calls" in messages[11]
    assert "tool_calls" not in messages[-1] and messages[-1]["content"] == "All 48 unit tests pass."


def test_history_keeps_interrupted_text_and_leaves_out_reasoning_only_prefixes() -> None:
    messages = history(read(FIXTURES / "cancelled-mid-stream"))
    validate_request(messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"].startswith("## 1.4.1")
    assert "reasoning_content" in messages[1]


def test_history_of_a_cancelled_tool_carries_the_aborted_results() -> None:
    messages = history(read(FIXTURES / "cancelled-mid-tool"))
    validate_request(messages)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert "[stopped: aborted by user" in results[0]
    assert results[1] == "Error: tool call aborted before dispatch"


def test_history_after_repair_answers_every_call(tmp_path: Path) -> None:
    messages = history(_loaded("crashed-mid-tool", tmp_path))
    validate_request(messages)
    tools = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["c1-1-1", "c1-1-2"]
    assert tools[0]["content"].endswith("Do not retry blindly.")
    assert "never started" in tools[1]["content"]


def test_a_reply_cut_off_by_a_crash_is_not_reconstructed(tmp_path: Path) -> None:
    events = _loaded("crashed-mid-stream", tmp_path)
    messages = history(events)
    validate_request(messages)
    # step 2 streamed chunks but committed nothing: the history ends with step 1's result
    assert messages[-1]["role"] == "tool"
    assert not any(e.type == "assistant/message" and e.data.step == 2 for e in events)


def test_history_of_a_live_step_drops_calls_whose_results_are_not_in_yet() -> None:
    sim = Sim()
    sim.start()
    sim.queue("go")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    calls = sim.reply(
        [
            ReasoningBlock("two calls"),
            ToolCallBlock(sim.call_id(1), "bash", "{}"),
            ToolCallBlock(sim.call_id(2), "bash", "{}"),
        ]
    )
    for call in calls:
        sim.tool_call(call)
    sim.result(calls[0].call_id, "one")
    messages = history(_dicts(sim))
    validate_request(messages)
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1-1-1"]
    # with no result at all the reply has neither text nor answered calls: it is left out
    assert history(_dicts(sim)[:-1]) == [{"role": "user", "content": "go"}]


def test_history_keeps_reasoning_content_on_every_assistant_message() -> None:
    # The model adapter decides what to send back (DeepSeek thinking mode needs it on every
    # assistant message of a tool-using span): the fold keeps it on all of them, "" when none.
    messages = history(read(FIXTURES / "complete"))
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert all(isinstance(m["reasoning_content"], str) for m in assistants)
    assert assistants[0]["reasoning_content"].startswith("The user says the CI build fails.")
    sim = Sim()
    sim.start()
    sim.queue("go")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    calls = sim.reply([ToolCallBlock(sim.call_id(1), "bash", "{}")])  # tool calls, no reasoning
    sim.tool_call(calls[0])
    sim.result(calls[0].call_id, "ok")
    sim.end_step()
    sim.begin_step([])
    sim.reply([ReasoningBlock("a "), TextBlock("done"), ReasoningBlock("and more")])
    sim.end_step()
    sim.begin_step([])
    sim.reply([TextBlock("plain")])  # text only
    messages = history(_dicts(sim))
    validate_request(messages)
    assert [m.get("reasoning_content") for m in messages if m["role"] == "assistant"] == [
        "",
        "a and more",
        "",
    ]
    assert all("reasoning_content" not in m for m in messages if m["role"] != "assistant")


def test_history_streams_without_reading_everything_first() -> None:
    stream = iter_records(FIXTURES / "complete")
    assert history(stream) == history(read(FIXTURES / "complete"))


# --- consumed work --------------------------------------------------------------------------------


def test_consumed_work_of_the_discarded_queue_fixture() -> None:
    records = read(FIXTURES / "cancel-discarded-queue")
    work = fold_consumed_work(records)
    assert work.dropped_unrun
    assert work.end is not None and work.end["data"]["turn"] == 2
    assert work.end == records[33].to_dict()
    # turn 1's cancel discarded queued work too, but its turn/end came after the discard and,
    # becoming the accounting end, reset dropped_unrun (docs/log-format.md, What is derived from
    # the log)
    first = fold_consumed_work(records[:19])
    assert first.end is not None and first.end["data"]["turn"] == 1
    assert not first.dropped_unrun
    # just before the idle cancel: turn 2 is the accounting end and nothing was dropped after it
    before_idle_cancel = fold_consumed_work(records[:34])
    assert before_idle_cancel.end == work.end and not before_idle_cancel.dropped_unrun


def test_consumed_work_rules() -> None:
    sim = Sim()
    sim.start()
    assert fold_consumed_work(_dicts(sim)).end is None
    # a turn that claimed input and was blocked before any step accounts for it
    sim.queue("a")
    sim.begin_turn()
    sim.claim(first_step=True)
    sim.end_turn(Blocked("policy"))
    blocked = fold_consumed_work(_dicts(sim))
    assert blocked.end is not None and blocked.end["data"]["reason"]["kind"] == "blocked"
    # a turn with no step and no claimed input (completed at once) does not
    sim.begin_turn()
    sim.end_turn(Completed())
    assert fold_consumed_work(_dicts(sim)).end == blocked.end
    # nor does one that claimed input but completed without a step
    sim.queue("b")
    sim.begin_turn()
    sim.claim(first_step=True)
    sim.end_turn(Completed())
    assert fold_consumed_work(_dicts(sim)).end == blocked.end
    # a cancel that removes queued work sets dropped_unrun ...
    sim.queue("c")
    sim.cancel_inbox()
    assert fold_consumed_work(_dicts(sim)).dropped_unrun
    # ... and a turn with a step becomes the accounting end and resets it
    sim.queue("d")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.end_step()
    sim.end_turn(TurnFailed("boom", "SERVER"))
    work = fold_consumed_work(_dicts(sim))
    assert not work.dropped_unrun and work.end is not None
    assert work.end["data"]["reason"]["kind"] == "error"


# --- state ----------------------------------------------------------------------------------------


def test_state_replays_the_inbox_splices() -> None:
    sim = Sim()
    sim.start()
    a = sim.queue("a")
    b = sim.queue("b")
    c = sim.queue("c")
    s = sim.queue("steer", "next-step", "steer")
    state = fold_state(_dicts(sim))
    assert state.next_turn == (a, b, c) and state.next_step == (s,)
    assert (state.last_turn, state.open_turn, state.open_step) == (0, None, None)
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))  # claims the steer and "a"
    state = fold_state(_dicts(sim))
    assert state.next_turn == (b, c) and state.next_step == ()
    assert (state.last_turn, state.open_turn, state.open_step) == (1, 1, 1)
    assert state.session_id == sim.session_id and state.next_seq == len(sim.events)


def test_state_of_a_replace_and_a_remove() -> None:
    from andon.session import InboxSpliced, UserMessage

    sim = Sim()
    sim.start()
    _a, _b, c = (sim.queue(t) for t in "abc")
    x = UserMessage("m-000000000abc", "x")
    sim.emit(InboxSpliced("next-turn", 1, (x,), 1))  # replace b by x
    sim.emit(InboxSpliced("next-turn", 0, (), 1))  # remove a (while idle: not a claim)
    state = fold_state(_dicts(sim))
    assert state.next_turn == (x, c)
    assert not fold_consumed_work(_dicts(sim)).dropped_unrun


def test_state_after_a_resume_continues_turn_numbering() -> None:
    state = fold_state(read(FIXTURES / "repaired-and-resumed"))
    assert state.last_turn == 2 and state.open_turn is None
    assert state.next_turn == () and state.next_step == ()


def test_state_of_the_parked_follow_up() -> None:
    records = read(FIXTURES / "cancel-discarded-queue")
    parked = fold_state(records[:34]).next_turn
    assert [m.content for m in parked] == ["And then run the linter."]
    assert fold_state(records).next_turn == ()


# --- transcript -----------------------------------------------------------------------------------


def test_transcript_of_a_cancelled_tool() -> None:
    text = render_transcript(read(FIXTURES / "cancelled-mid-tool"))
    assert "turn 1" in text and "step 1" in text
    assert "user: Rebuild everything from scratch and run the tests." in text
    assert "tool c1-1-1 bash" in text
    assert "SIGTERM at +6.12s to 5 processes" in text
    assert "[stopped] result c1-1-1: error, signal 15, after 6.13s, ended by term" in text
    assert "ABORTED_BEFORE_DISPATCH" in text
    assert "turn 1 ended after" in text and "aborted (by user)" in text


def test_transcript_says_queued_work_was_discarded() -> None:
    text = render_transcript(read(FIXTURES / "cancel-discarded-queue"))
    assert "queued work discarded unrun: 1 message from next-turn" in text
    assert "queued work discarded unrun: 1 message from next-step" in text


def test_transcript_of_a_repaired_crash(tmp_path: Path) -> None:
    text = render_transcript(_loaded("torn-tail", tmp_path))
    assert "TOOL_OUTCOME_UNKNOWN" in text and "(written by crash repair)" in text
    assert "interrupted" in text
    assert "torn bytes moved to events.jsonl.torn-" in text


def test_transcript_of_a_live_or_crashed_log(tmp_path: Path) -> None:
    text = render_transcript(read(FIXTURES / "crashed-mid-stream"))
    assert "the reply was cut off" not in text  # the step never ended: no verdict yet
    assert "turn 1 is still open" in text
    repaired = render_transcript(_loaded("crashed-mid-stream", tmp_path))
    assert "(the reply was cut off: 6 chunks streamed, nothing kept)" in repaired
    assert "still open" not in repaired


def test_transcript_of_every_fixture_renders(tmp_path: Path) -> None:
    for path in sorted(FIXTURES.iterdir()):
        if path.name == "corrupt-middle":
            continue
        text = render_transcript(_loaded(path.name, tmp_path / path.name))
        assert text.startswith("session s-") and text.endswith("\n")


def test_aborted_helper_matches_the_wire() -> None:
    assert aborted(User()).to_json() == {"kind": "aborted", "reason": {"kind": "user"}}
    assert TextBlock("x").to_json() == {"type": "text", "text": "x"}
