"""MCP servers under a tool worker's containment (docs/tools.md, MCP servers). An internal face
for now: neither ``andon run`` nor the agent uses it yet.

:data:`MCP_HOST` is the hidden shell tool a server runs under; :class:`McpServer` is the
supervisor's side. The official MCP SDK (``pip install 'andon[mcp]'``) is imported only when a
server starts, never when andon does.
"""

from andon.mcp._client import McpError, McpOutcome, McpServer, McpServerConfig, McpTool
from andon.mcp._host_tool import MCP_HOST

__all__ = ["MCP_HOST", "McpError", "McpOutcome", "McpServer", "McpServerConfig", "McpTool"]
