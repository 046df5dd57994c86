"""A message given to the agent as a ``str`` with lone surrogates (read with surrogateescape,
``sys.argv``) is made valid Unicode before the log sees it (docs/log-format.md, Text)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.supervisor.support import agent_for, assert_sound, records


async def test_a_message_with_surrogate_escapes_is_logged_with_u_fffd(tmp_path: Path) -> None:
    async with agent_for(tmp_path, [{"text": "one"}, {"text": "two"}]) as agent:
        agent.followup(os.fsdecode(b"fix caf\xe9"))
        await agent.when_idle()
        agent.followup("odd \ud800 one")
        await agent.when_idle()
    users = [
        r["data"]["message"]["content"] for r in records(tmp_path) if r["type"] == "user/message"
    ]
    assert users == ["fix caf\ufffd", "odd \ufffd one"]
    assert_sound(tmp_path)
