"""Runs a job that outgrows its context window and SIGKILLs itself inside the first summary call,
at its chunk ``AT`` (see ``SummaryTripwire``): a crash in the middle of compaction.

Usage: python -m tests.supervisor.compaction_driver SESSION_DIR AT
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from andon.llm import OpenAICompatible, from_spec
from andon.testing import MockModelServer
from tests.supervisor.support import SummaryTripwire, agent_for, chatty_job
from tests.supervisor.test_compaction_stops import STEPS, SUMMARY, WINDOW


async def main(folder: str, at: int) -> None:
    async with MockModelServer(
        chatty_job(STEPS, 2000), context_window=WINDOW, summaries=SUMMARY
    ) as server:
        inner = from_spec(f"{server.base_url}#mock")
        assert isinstance(inner, OpenAICompatible)
        model = SummaryTripwire(inner, at, lambda: os.kill(os.getpid(), signal.SIGKILL))
        from pathlib import Path

        async with agent_for(Path(folder), model, context_window=WINDOW) as agent:
            agent.followup("go")
            await agent.when_idle()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
