"""``andon run --json`` prints each event through its class's codec (docs/agent-loop.md, Events):
a record's line is the log's record, and every line of an event reads back as the same event and
writes as the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

from andon.session import Record, event_from_dict, read
from tests.cli.support import run, script


def test_json_lines_are_the_logged_records_and_the_live_events(tmp_path: Path) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Ça va — building.",
                "reasoning": "think first",
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "echo héllo; echo 'done ✓'"}}
                ],
            },
            {"text": "Done ✓.", "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        ],
    )
    session = tmp_path / "s"
    result = run("run", "--json", "--model", model, "--session", str(session), "go", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    *lines, last = result.stdout.splitlines()
    assert json.loads(last)["type"] == "run/summary"

    logged = {record.seq: record for record in read(session)}
    seen_seqs = []
    kinds = set()
    for line in lines:
        event = event_from_dict(json.loads(line))
        kinds.add(event.type)
        # The codec writes back exactly the line it read: key order, numbers and text alike.
        assert json.dumps(event.to_dict(), ensure_ascii=False) == line
        if isinstance(event, Record):
            seen_seqs.append(event.seq)
            # The very record the log holds, printed as the log's own line is (but spaced).
            assert event == logged[event.seq]
            assert line == json.dumps(logged[event.seq].to_dict(), ensure_ascii=False)
    assert seen_seqs == sorted(logged)  # every record once, in order, nothing between
    assert {"agent/status", "assistant/delta", "tool/output", "tool/result"} <= kinds
    # The live lines' keys, in the order docs/agent-loop.md, Events gives them.
    keys = {tuple(json.loads(line)) for line in lines if '"seq"' not in line}
    assert keys == {
        ("type", "status"),
        ("type", "turn", "step", "attempt", "delta"),
        ("type", "call_id", "text"),
    }
