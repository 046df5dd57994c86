"""check(): every rule a log always keeps (docs/log-format.md), each violation with its seq and
a readable reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from andon.base import ErrorCode, User
from andon.session import Completed, InvariantViolation, TextBlock, ToolCallBlock, check, read
from tests.session.helpers import FIXTURES, Sim, aborted, lines_of

Log = list[dict[str, Any]]


def _base() -> Log:
    """A sound log: a turn with a tool step (two calls) and a text step, then a second turn."""
    sim = Sim()
    sim.start()
    sim.queue("Build it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    calls = sim.reply(
        [
            TextBlock("Building."),
            ToolCallBlock(sim.call_id(1), "bash", "{}"),
            ToolCallBlock(sim.call_id(2), "bash", "{}"),
        ]
    )
    for call in calls:
        sim.tool_call(call)
        sim.started(call.call_id)
    sim.signal(calls[0].call_id, "term", 2.0, 1)
    for call in calls:
        sim.result(call.call_id, "ok")
    sim.end_step()
    sim.begin_step()
    sim.request()
    sim.reply([TextBlock("Done.")])
    sim.end_step()
    sim.end_turn(Completed())
    sim.queue("Again.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.end_step()
    sim.end_turn(aborted(User()))
    return [json.loads(line) for line in lines_of(sim.data())]


def _renumber(log: Log) -> Log:
    for seq, record in enumerate(log):
        record["seq"] = seq
    return log


def _index(log: Log, type_: str, nth: int = 0, **data: Any) -> int:
    found = [
        i
        for i, r in enumerate(log)
        if r["type"] == type_ and all(r["data"].get(k) == v for k, v in data.items())
    ]
    return found[nth]


def test_the_base_log_and_every_fixture_are_sound() -> None:
    assert check(_base()) == []
    for path in sorted(FIXTURES.iterdir()):
        if path.name == "corrupt-middle":
            continue
        records = read(path)
        assert check(records, live=True) == [], path.name
        if records.torn is None:  # plain dicts work as well as records
            raw = (path / "events.jsonl").read_bytes().splitlines()
            assert check([json.loads(line) for line in raw], live=True) == [], path.name


def _only(violations: list[InvariantViolation], rule: int, seq: int, text: str) -> None:
    assert violations, "expected a violation"
    assert [(v.rule, v.seq) for v in violations][:1] == [(rule, seq)], violations
    assert text in violations[0].message, violations[0].message
    assert str(violations[0]).startswith(f"seq {seq}: invariant {rule}: ")


Mutation = Callable[[Log], tuple[int, str]]


def _gap(log: Log) -> tuple[int, str]:
    log[5]["seq"] = 50
    return 50, "seq must be contiguous"


def _not_first(log: Log) -> tuple[int, str]:
    log[0], log[1] = log[1], log[0]
    _renumber(log)
    return 0, "must be session/start"


def _nested_turn(log: Log) -> tuple[int, str]:
    i = _index(log, "turn/end", 0)
    del log[i]
    _renumber(log)
    return _index(log, "turn/start", 1), "turns do not nest"


def _wrong_number(log: Log) -> tuple[int, str]:
    i = _index(log, "turn/start", 1)
    log[i]["data"]["turn"] = 3
    for r in log[i:]:
        if "turn" in r["data"]:
            r["data"]["turn"] = 3
    return i, "the next is 2"


def _end_with_open_step(log: Log) -> tuple[int, str]:
    i = _index(log, "step/end", 1)
    del log[i]
    _renumber(log)
    return _index(log, "turn/end", 0), "still open"


def _step_outside_turn(log: Log) -> tuple[int, str]:
    i = _index(log, "turn/start", 1)
    log.insert(i, {"seq": 0, "time": 1.0, "type": "step/start", "data": {"turn": 2, "step": 1}})
    _renumber(log)
    return i, "outside any turn"


def _step_skips(log: Log) -> tuple[int, str]:
    i = _index(log, "step/start", 1)
    for r in log[i:]:
        if r["data"].get("step") == 2:
            r["data"]["step"] = 3
    return i, "the next is 2"


def _step_end_mismatch(log: Log) -> tuple[int, str]:
    i = _index(log, "step/end", 0)
    log[i]["data"]["step"] = 9
    return i, "open step is 1.1"


def _wrong_step_named(log: Log) -> tuple[int, str]:
    i = _index(log, "llm/request", 0)
    log[i]["data"]["step"] = 2
    return i, "names step 1.2"


def _outside_step(log: Log) -> tuple[int, str]:
    i = _index(log, "step/start", 0)
    log.insert(
        i,
        {
            "seq": 0,
            "time": 1.0,
            "type": "llm/request",
            "data": {"turn": 1, "step": 1, "attempt": 1, "model": "m"},
        },
    )
    _renumber(log)
    return i, "outside any step"


def _missing_result(log: Log) -> tuple[int, str]:
    i = _index(log, "tool/result", 1)
    del log[i]
    _renumber(log)
    return _index(log, "step/end", 0), "c1-1-2 has no tool/result"


def _result_without_call(log: Log) -> tuple[int, str]:
    i = _index(log, "tool/call", 1)
    del log[i]
    _renumber(log)
    return _index(log, "tool/started", 1), "has no tool/call"


def _not_started_result_is_allowed_alone(log: Log) -> tuple[int, str]:
    # the one exception: a repair result TOOL_NOT_STARTED; a plain result alone is a violation
    i = _index(log, "tool/call", 1)
    del log[i]
    j = _index(log, "tool/started", 1)
    del log[j]
    _renumber(log)
    k = _index(log, "tool/result", 1)
    return k, "only a repair result with code TOOL_NOT_STARTED"


def _results_out_of_order(log: Log) -> tuple[int, str]:
    a, b = _index(log, "tool/result", 0), _index(log, "tool/result", 1)
    log[a], log[b] = log[b], log[a]
    _renumber(log)
    return b, "results appear in model order"


def _duplicate_call_id(log: Log) -> tuple[int, str]:
    i = _index(log, "tool/call", 1)
    log[i]["data"]["call_id"] = "c1-1-1"
    return i, "unique"


def _started_after_result(log: Log) -> tuple[int, str]:
    i = _index(log, "tool/started", 0)
    started = log.pop(i)
    j = _index(log, "tool/result", 0)
    log.insert(j + 1, started)
    _renumber(log)
    return j + 1, "after its tool/result"


def _call_not_requested(log: Log) -> tuple[int, str]:
    i = _index(log, "tool/call", 1)
    log[i]["data"]["call_id"] = "c1-1-9"
    return i, "not one of the tool calls"


def _between_turns(log: Log) -> tuple[int, str]:
    i = _index(log, "turn/start", 1)
    log.insert(
        i,
        {
            "seq": 0,
            "time": 1.0,
            "type": "llm/request",
            "data": {"turn": 1, "step": 1, "attempt": 1, "model": "m"},
        },
    )
    _renumber(log)
    return i, "between turns"


def _interrupted_with_call(log: Log) -> tuple[int, str]:
    i = _index(log, "assistant/message", 0)
    log[i]["data"]["interrupted"] = True
    log[i]["data"]["finish"] = "aborted"
    return i, "interrupted reply holds tool call"


def _interrupted_blank_text(log: Log) -> tuple[int, str]:
    i = _index(log, "assistant/message", 1)
    log[i]["data"]["interrupted"] = True
    log[i]["data"]["message"]["content"] = [{"type": "text", "text": "  \n"}]
    return i, "empty text block"


def _open_at_end(log: Log) -> tuple[int, str]:
    del log[-2:]
    return _index(log, "step/start", 2), "never ends"


def _turn_end_without_turn(log: Log) -> tuple[int, str]:
    log.append(
        {
            "seq": len(log),
            "time": 1.0,
            "type": "turn/end",
            "data": {"turn": 2, "reason": {"kind": "completed"}},
        }
    )
    return len(log) - 1, "no turn open"


def _resumed_inside_turn(log: Log) -> tuple[int, str]:
    i = _index(log, "step/start", 0)
    log.insert(
        i,
        {
            "seq": 0,
            "time": 1.0,
            "type": "session/resumed",
            "data": {
                "pid": 1,
                "host": "h",
                "andon_version": "0.1.0",
                "model": {"spec": "m", "provider": "p", "name": "m"},
                "system_prompt": "",
                "repaired": False,
            },
        },
    )
    _renumber(log)
    return i, "while turn 1 is open"


@pytest.mark.parametrize(
    ("rule", "mutate"),
    [
        (1, _gap),
        (1, _not_first),
        (2, _nested_turn),
        (2, _wrong_number),
        (2, _end_with_open_step),
        (2, _turn_end_without_turn),
        (2, _resumed_inside_turn),
        (2, _open_at_end),
        (3, _step_outside_turn),
        (3, _step_skips),
        (3, _step_end_mismatch),
        (4, _wrong_step_named),
        (4, _outside_step),
        (5, _missing_result),
        (5, _result_without_call),
        (5, _not_started_result_is_allowed_alone),
        (5, _results_out_of_order),
        (5, _duplicate_call_id),
        (5, _started_after_result),
        (5, _call_not_requested),
        (6, _between_turns),
        (7, _interrupted_with_call),
        (7, _interrupted_blank_text),
    ],
)
def test_each_violation_is_reported_with_its_seq(rule: int, mutate: Mutation) -> None:
    log = _base()
    seq, text = mutate(log)
    violations = check(log)
    if mutate is _open_at_end:
        # the step never ended (reported at its step/start), and neither did the turn
        assert [(v.rule, v.seq) for v in violations] == [
            (3, seq),
            (2, _index(log, "turn/start", 1)),
        ]
        assert "never ends" in violations[0].message
        return
    _only(violations, rule, seq, text)


def test_the_lone_not_started_repair_result_is_allowed() -> None:
    log = _base()
    i = _index(log, "tool/call", 1)
    del log[i]
    j = _index(log, "tool/started", 1)
    del log[j]
    k = _index(log, "tool/result", 1)
    log[k]["data"]["is_error"] = True
    log[k]["data"]["error"] = {
        "name": "HarnessStopped",
        "code": ErrorCode.TOOL_NOT_STARTED.value,
        "message": "never started",
    }
    log[k]["synthetic"] = "repair"
    # the signal record of the first call stays valid; renumber after the deletions
    assert check(_renumber(log)) == []


def test_a_live_log_may_end_inside_a_turn_and_step() -> None:
    log = _base()
    cut = _index(log, "tool/started", 0) + 1
    prefix = log[:cut]
    assert check(prefix, live=True) == []
    assert {v.rule for v in check(prefix)} == {2, 3}


def test_every_prefix_of_a_sound_log_is_a_sound_live_log() -> None:
    log = _base()
    for n in range(1, len(log) + 1):
        assert check(log[:n], live=True) == [], n
