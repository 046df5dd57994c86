"""Tools (re-exported from ``andon.workers``): ``@andon.tool``, ``default()``, ``ToolRegistry``."""

from andon.workers import BASH, Tool, ToolRegistry, default, tool

__all__ = ["BASH", "Tool", "ToolRegistry", "default", "tool"]
