"""MCP servers under a tool worker's containment (docs/tools.md, MCP servers).

:class:`McpServers` is what ``open_agent(providers=[...])`` takes: a session's servers, started
with it, their tools offered as ``NAME__tool``. :data:`MCP_HOST` is the hidden shell tool a
server runs under; :class:`McpServer` is the supervisor's side of one server. The official
MCP SDK (``pip install 'andon[mcp]'``) is imported only when a
server starts, never when andon does. An internal face: `andon run` uses it; its Python API may
still change.
"""

from andon.mcp._client import McpError, McpOutcome, McpServer, McpServerConfig, McpTool
from andon.mcp._host_tool import MCP_HOST
from andon.mcp._provider import SEPARATOR, McpServers, ServerChoice

__all__ = [
    "MCP_HOST",
    "SEPARATOR",
    "McpError",
    "McpOutcome",
    "McpServer",
    "McpServerConfig",
    "McpServers",
    "McpTool",
    "ServerChoice",
]
