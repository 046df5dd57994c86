"""A parent agent that delegates to a subagent whose tool runs forever; prints ``ready`` once the
child's tool has started. Usage: python -m tests.supervisor.subagent_driver SESSION_DIR"""

from __future__ import annotations

import asyncio
import sys

import andon
from andon.fleet import WorkerPoolConfig
from andon.llm import Scripted
from andon.session import SubagentEvent
from andon.supervisor import subagent_tool
from tests.supervisor.support import CHILD_SLOW, DELEGATE
from tests.workers.pytools import registry


async def main(folder: str) -> None:
    tools = registry()
    tools.add(subagent_tool(lambda: Scripted(list(CHILD_SLOW))))
    async with andon.open_agent(
        folder,
        model=Scripted([DELEGATE]),
        tools=tools,
        pool=WorkerPoolConfig(size=1, containment="subreaper"),
    ) as agent:
        stream = agent.events()
        agent.followup("delegate")
        async for item in stream:
            if isinstance(item, SubagentEvent) and item.event.type == "tool/started":
                print("ready", flush=True)
        await agent.when_idle()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
