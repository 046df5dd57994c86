"""A session id given to ``open_agent`` (docs/log-format.md, Ids): the ids users pass
(``my_session``, ``build.42``, a CI build id) run calls end to end and tag their processes; any
other is a ``ConfigError`` naming the allowed form before anything is opened. Real workers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import andon
from andon.base import ConfigError, call_tag, check_session_id, parse_call_id
from andon.llm import Scripted
from tests.supervisor.support import agent_for, assert_sound, records

PROBE = {
    "text": "Probing.",
    "tool_calls": [{"name": "bash", "arguments": {"command": 'echo "tag=$ANDON_CALL_TAG"'}}],
}


@pytest.mark.parametrize("sid", ["my_session", "build.42", "github-7781234-1", "1234567890"])
async def test_a_reasonable_session_id_runs_calls_tagged_with_it(tmp_path: Path, sid: str) -> None:
    async with agent_for(tmp_path, [PROBE, {"text": "Done."}], session_id=sid) as agent:
        agent.followup("go")
        await agent.when_idle()
    recs = records(tmp_path)
    assert recs[0]["data"]["session_id"] == sid
    results = [r["data"] for r in recs if r["type"] == "tool/result"]
    assert [r.get("error") for r in results] == [None], results
    assert results[0]["content"].startswith(f"tag={sid}-c1-1-1\n")
    assert_sound(tmp_path)


@pytest.mark.parametrize(
    "sid", ["my session", "", "a/b", ".hidden", "x" * 65, "caf\u00e9", "tab\there", 42]
)
async def test_another_session_id_is_a_config_error_before_anything_is_opened(
    tmp_path: Path, sid: object
) -> None:
    folder = tmp_path / "session"
    form = re.escape("letters, digits, '.', '_' or '-'")
    with pytest.raises(ConfigError, match=form) as caught:
        async with andon.open_agent(
            folder,
            model=Scripted([{"text": "never"}]),
            session_id=sid,  # type: ignore[arg-type]  # a wrong type on purpose
        ):
            pytest.fail("opened")
    assert repr(sid) in str(caught.value)
    assert not folder.exists()


async def test_a_logged_session_id_that_cannot_tag_calls_refuses_the_resume(
    tmp_path: Path,
) -> None:
    """A log an unchecked andon wrote with such an id: one clear error, and nothing appended
    (every call of it would otherwise fail ``INTERNAL``)."""
    async with agent_for(tmp_path, [{"text": "Hi."}]) as agent:
        agent.followup("go")
        await agent.when_idle()
    log = tmp_path / "events.jsonl"
    lines = log.read_text().splitlines()
    first = json.loads(lines[0])
    first["data"]["session_id"] = "my session"
    log.write_text("\n".join([json.dumps(first, separators=(",", ":")), *lines[1:]]) + "\n")
    before = log.read_bytes()
    with pytest.raises(ConfigError, match="cannot resume this session: session_id 'my session'"):
        async with agent_for(tmp_path, [{"text": "never"}]):
            pytest.fail("opened")
    assert log.read_bytes() == before


def test_tags_of_different_owners_and_calls_never_meet() -> None:
    owners = ["s-0123456789ab", "my_session", "build.42", "a-c1", "a-c1-1", "x.c1-1-1", "9"]
    calls = ["c1-1-1", "c1-1-2", "c11-1-1", "c1-11-1", "c2-3-4"]
    tags = {call_tag(o, c): (o, c) for o in owners for c in calls}
    assert len(tags) == len(owners) * len(calls)
    for tag, (owner, call) in tags.items():
        head, *rest = tag.rsplit("-", 3)
        assert (head, "-".join(rest)) == (owner, call)
        parse_call_id(call)
    assert check_session_id("build.42") == "build.42"
