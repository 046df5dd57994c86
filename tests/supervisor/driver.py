"""Runs an agent whose model asks for a long tool call; prints ``ready`` once the tool runs.

Usage: python -m tests.supervisor.driver SESSION_DIR
"""

from __future__ import annotations

import asyncio
import sys

import andon
from andon.fleet import WorkerPoolConfig
from andon.llm import Scripted
from andon.session import ToolOutput


async def main(folder: str) -> None:
    model = Scripted(
        [
            {
                "text": "Deploying.",
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "echo started; exec sleep 1000"}},
                    {"name": "bash", "arguments": {"command": "echo second"}},
                ],
            }
        ]
    )
    async with andon.open_agent(
        folder, model=model, pool=WorkerPoolConfig(size=1, containment="subreaper")
    ) as agent:
        stream = agent.events()
        agent.followup("deploy")
        async for item in stream:
            if isinstance(item, ToolOutput) and "started" in item.text:
                print("ready", flush=True)
        await agent.when_idle()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
