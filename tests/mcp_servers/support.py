"""A real worker pool whose registry holds the MCP host beside the default tools."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from andon.base import ContainmentSetting
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.mcp import MCP_HOST, McpServer, McpServerConfig
from andon.supervisor import ToolExecutor
from andon.workers import default

FAKE = str(Path(__file__).with_name("fake_server.py"))


def fake(mode: str, **options: float) -> McpServerConfig:
    return McpServerConfig(f"fake-{mode}", (sys.executable, FAKE, mode), **options)  # type: ignore[arg-type]


def console_script(name: str) -> str:
    """A console script installed beside this Python (a server pip installed)."""
    return os.path.join(os.path.dirname(sys.executable), name)


@asynccontextmanager
async def executor(
    containment: ContainmentSetting = "subreaper", size: int = 2
) -> AsyncIterator[ToolExecutor]:
    registry = default()
    registry.add(MCP_HOST)
    async with WorkerPool(WorkerPoolConfig(size=size, containment=containment), registry) as pool:
        yield ToolExecutor(pool, registry)


class Lines:
    """What a call gave ``on_output``, and a wait for a line that says something."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        self._changed.set()

    async def wait_for(self, text: str) -> None:
        while not any(text in line for line in self.lines):
            self._changed.clear()
            await self._changed.wait()


def server(config: McpServerConfig, ex: ToolExecutor) -> McpServer:
    return McpServer(config, ex)
