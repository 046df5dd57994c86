"""Which MCP servers a session starts (docs/tools.md, MCP servers), from three places:

* ``[mcp.servers.NAME]`` tables of ``andon.toml``::

      [mcp.servers.time]
      command = "mcp-server-time"
      args = ["--local-timezone", "UTC"]
      env = { TZ = "UTC" }          # the server's environment is built from nothing plus this
      cwd = "tools"                 # relative to the folder of andon.toml
      enabled_tools = ["get_current_time"]   # or disabled_tools = [...]
      startup_timeout = 30          # seconds for the server to answer initialize
      tool_timeout = 120            # seconds for one of its calls

* ``--mcp-config FILE``: the ``{"mcpServers": {NAME: {"command", "args", "env", "cwd"}}}`` JSON
  file other agent tools read;
* ``--mcp 'NAME=COMMAND ARGS…'`` on the command line (split as a shell would, no expansion).

A later place wins for the same name: the file over ``andon.toml``, a flag over both. Every mistake
is one line naming the place and the key.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from andon.base import ConfigError, UnreadableFile, read_small_file

__all__ = [
    "MCP",
    "McpServerSettings",
    "merge_servers",
    "parse_mcp_flag",
    "parse_mcp_json",
    "parse_mcp_table",
]

MCP: Final = "mcp"
"""The ``andon.toml`` table of MCP servers (``[mcp.servers.NAME]``)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,31}")
"""A server's name: it prefixes each of its tools (``NAME__tool``), and a tool name the model sees
is at most 64 of ``[A-Za-z0-9_-]``; ``__`` is the separator, so the name holds no ``_``."""
_MAX_CONFIG_BYTES: Final = 1 << 20
_KNOWN: Final = (
    "command",
    "args",
    "env",
    "cwd",
    "enabled_tools",
    "disabled_tools",
    "startup_timeout",
    "tool_timeout",
)
_JSON_KNOWN: Final = ("command", "args", "env", "cwd", "type", "disabled")


@dataclass(frozen=True)
class McpServerSettings:
    """One stdio MCP server: ``argv`` is its command and arguments, ``env`` all of its
    environment beyond andon's few basics, ``cwd`` its working directory (None: the tools')."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None
    enabled_tools: tuple[str, ...] | None = None  # None: all
    disabled_tools: tuple[str, ...] = ()
    startup_timeout: float = 30.0
    tool_timeout: float | None = None  # None: the session's tool timeout


def _name(name: object, where: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: server name {name!r} must be 1 to 32 letters, digits or '-', starting "
            "with a letter or digit (it prefixes the server's tool names)"
        )
    return name


def _strings(value: object, what: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {what} must be a list of strings")
    return tuple(value)


def _env(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f'{where}: env must be a table of NAME = "value" strings')
    return dict(value)


def _seconds(value: object, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {what} must be a number of seconds")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{where}: {what} must be a finite, positive number of seconds")
    return seconds


def _command(command: object, args: object, where: str) -> tuple[str, ...]:
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"{where}: command must be a non-empty string")
    return (command, *(_strings(args, "args", where) if args is not None else ()))


def _server(name: str, table: Mapping[str, Any], where: str, base: Path) -> McpServerSettings:
    for key in table:
        if key not in _KNOWN:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(_KNOWN)})")
    if "command" not in table:
        raise ConfigError(f"{where}: command is missing (the program that starts the server)")
    enabled = table.get("enabled_tools")
    disabled = table.get("disabled_tools")
    if enabled is not None and disabled is not None:
        raise ConfigError(f"{where}: give enabled_tools or disabled_tools, not both")
    cwd = table.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise ConfigError(f"{where}: cwd must be a non-empty string")
    return McpServerSettings(
        name=name,
        argv=_command(table["command"], table.get("args"), where),
        env=_env(table.get("env", {}), where),
        cwd=None if cwd is None else str(base / cwd),
        enabled_tools=None if enabled is None else _strings(enabled, "enabled_tools", where),
        disabled_tools=() if disabled is None else _strings(disabled, "disabled_tools", where),
        startup_timeout=_seconds(table.get("startup_timeout", 30.0), "startup_timeout", where),
        tool_timeout=None
        if table.get("tool_timeout") is None
        else _seconds(table["tool_timeout"], "tool_timeout", where),
    )


def parse_mcp_table(table: object, path: Path) -> tuple[McpServerSettings, ...]:
    """The ``[mcp]`` table of ``andon.toml`` at ``path``: its ``servers`` subtables."""
    where = f"{path}: [{MCP}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    for key in table:
        if key != "servers":
            raise ConfigError(f"{where}: unknown key {key!r} (known: servers)")
    servers = table.get("servers", {})
    if not isinstance(servers, dict):
        raise ConfigError(f"{where}: servers must hold one [mcp.servers.NAME] table per server")
    out = []
    for name, entry in servers.items():
        here = f"{path}: [{MCP}.servers.{name}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{here} must be a table")
        out.append(_server(_name(name, here), entry, here, path.parent))
    return tuple(out)


def parse_mcp_json(path: Path) -> tuple[McpServerSettings, ...]:
    """An ``mcpServers`` JSON file (``--mcp-config FILE``); its relative ``cwd`` is taken from
    the file's folder. A server given by URL (streamable HTTP) is refused with its name: andon
    starts stdio servers only."""
    try:
        found = read_small_file(path, _MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"--mcp-config {path}: no such file") from None
    except UnreadableFile as e:
        raise ConfigError(f"--mcp-config {path}: {e.reason}") from None
    if found.over(_MAX_CONFIG_BYTES):
        raise ConfigError(f"--mcp-config {path}: larger than {_MAX_CONFIG_BYTES} bytes")
    try:
        document = json.loads(found.data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"--mcp-config {path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--mcp-config {path}: not JSON ({e})") from None
    except RecursionError:
        raise ConfigError(f"--mcp-config {path}: not JSON (nested too deeply)") from None
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers"), dict):
        raise ConfigError(f'--mcp-config {path}: expected {{"mcpServers": {{NAME: {{...}}}}}}')
    out = []
    for name, entry in document["mcpServers"].items():
        where = f"--mcp-config {path}: mcpServers.{name}"
        _name(name, where)
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be an object")
        if "url" in entry or entry.get("type") in ("http", "sse", "streamable-http"):
            raise ConfigError(
                f"{where}: a server reached by URL is not supported; andon starts stdio servers "
                "(a command) only"
            )
        if entry.get("disabled") is True:
            continue
        for key in entry:
            if key not in _JSON_KNOWN:
                raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(_JSON_KNOWN)})")
        table = {k: v for k, v in entry.items() if k in ("command", "args", "env", "cwd")}
        out.append(_server(name, table, where, path.parent))
    return tuple(out)


def parse_mcp_flag(text: str) -> McpServerSettings:
    """``--mcp 'NAME=COMMAND ARGS…'``: split as a shell would, without expansion."""
    name, sep, command = text.partition("=")
    where = f"--mcp {text!r}"
    if not sep:
        raise ConfigError(f"{where}: expected NAME=COMMAND [ARGS…]")
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if not argv:
        raise ConfigError(f"{where}: the command is empty")
    return McpServerSettings(name=_name(name.strip(), where), argv=tuple(argv), env={})


def merge_servers(*groups: Sequence[McpServerSettings]) -> tuple[McpServerSettings, ...]:
    """Servers by name, a later group's replacing an earlier one's of the same name (flags win
    over the file, the file over ``andon.toml``), in the order first named."""
    merged: dict[str, McpServerSettings] = {}
    for group in groups:
        for server in group:
            merged[server.name] = server
    return tuple(merged.values())
