"""A log that cannot be written stops the agent honestly (docs/log-format.md, When the disk
fails)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from andon.base import LogWriteFailed, User
from andon.llm import Scripted
from andon.session import SessionLog, load
from tests.supervisor.support import Watcher, agent_on, records


class DiskFills:
    """A write seam: real writes until ``fail`` is set, then ENOSPC."""

    def __init__(self) -> None:
        self.fail = False

    def __call__(self, fd: int, data: bytes) -> int:
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)


async def test_a_failed_append_stops_the_turn_and_every_later_send(tmp_path: Path) -> None:
    disk = DiskFills()
    log = SessionLog.open(tmp_path, write=disk)
    model = Scripted(
        [
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "echo ready; exec sleep 1000"}}
                ]
            }
        ]
    )
    async with agent_on(log, model, tmp_path) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await watcher.wait_output("ready")
        disk.fail = True  # the disk fills while the tool runs
        agent.cancel(User())  # the tool/result can no longer be written
        with pytest.raises(LogWriteFailed):
            await agent.when_idle()
        error = await watcher.wait_error()
        assert error.code == "LOG_WRITE_FAILED"
        with pytest.raises(LogWriteFailed):
            agent.followup("more")
        await agent.aclose()
        await watcher.close()
    await log.aclose()
    # Nothing half-written: the log loads (repair closes what could not be closed).
    loaded = load(tmp_path)
    assert loaded.events[0].type == "session/start"
    assert records(tmp_path)[-1]["type"] in ("session/repaired", "turn/end")
