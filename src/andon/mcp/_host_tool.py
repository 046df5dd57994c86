"""``MCP_HOST``: the hidden shell tool an MCP server runs under (docs/tools.md, MCP servers)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from andon.workers import Tool

__all__ = ["MCP_HOST", "MCP_HOST_NAME", "host_command"]

MCP_HOST_NAME = "mcp-host"

MCP_HOST = Tool(
    name=MCP_HOST_NAME,
    description=(
        "Internal: hosts an MCP stdio server inside a tool worker. Never offered to a model."
    ),
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
    kind="shell",
    parallel_safe=True,
    # A server lives as long as its session: no timeout of its own, and no cap.
    timeout=None,
    max_timeout=None,
    extra={"internal": True},
)
"""Add it to the registry of the pool the servers run in; the agent must not offer it (a tool
whose ``extra["internal"]`` is true)."""


def host_command(spec_path: str) -> str:
    """The host call's shell command: the host program ``exec``'d, so it is the call's leader.

    Run by its file path with ``-I``: the host imports nothing of andon, and an isolated Python
    reads no ``PYTHON*`` variable and no user site."""
    host = Path(__file__).with_name("_host.py")
    return "exec " + shlex.join([sys.executable, "-I", str(host), spec_path])
