"""A session's MCP servers as tools the agent offers (docs/tools.md, MCP servers): a
:class:`~andon.supervisor.ToolProvider` for ``open_agent(providers=...)``.

The servers start when the session opens, side by side, each within its ``startup_timeout``, on
the session's own pool (each holds one worker while it runs: the pool needs one worker more per
server than the agent's calls). A server that cannot start is one warning line naming it and why,
and the session goes on without its tools. Each of a server's tools is offered as
``NAME__tool``: a supervisor-side tool whose call is a ``tools/call`` through
:meth:`McpServer.call`, stopped as that method says (``notifications/cancelled``, then the host's
SIGTERM and SIGKILL), with the progress and log messages as the call's live output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from andon.base import AbortController, ConfigError, ErrorCode, Timeout
from andon.fleet import WorkerPool
from andon.mcp._client import McpError, McpServer, McpServerConfig, McpTool
from andon.mcp._host_tool import MCP_HOST
from andon.protocol import ErrorInfo
from andon.session import EventData, McpServerEvent, ToolOutput
from andon.supervisor import ToolExecutor, ToolOutcome
from andon.workers import Tool, ToolRegistry

__all__ = ["MAX_OFFERED", "SEPARATOR", "McpServers", "ServerChoice"]

SEPARATOR: Final = "__"
"""Between a server's name and its tool's in the name the model sees: ``time__get_current_time``."""
_MODEL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What the model APIs accept as a tool name."""
MAX_OFFERED: Final = 100
"""The most MCP tools a session offers, over all its servers. Model APIs take a bounded number of
tools per request (OpenAI's: 128), and every schema costs context on every request; the built-in
and Python tools keep the rest. A server that lists more is offered its first ones, in its
order, with one warning line saying how to choose (``enabled_tools``)."""

_log = logging.getLogger("andon.mcp")


@final
@dataclass(frozen=True)
class ServerChoice:
    """One server and which of its tools the session offers (``enabled``: only those; None:
    all but ``disabled``), each call within ``tool_timeout`` seconds (None: no limit)."""

    config: McpServerConfig
    enabled: tuple[str, ...] | None = None
    disabled: tuple[str, ...] = ()
    tool_timeout: float | None = None


@final
class McpServers:
    """The provider: ``open_agent(..., providers=[McpServers(choices)])``."""

    def __init__(self, choices: Sequence[ServerChoice]) -> None:
        names = [c.config.name for c in choices]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ConfigError(f"two MCP servers are named {dup!r}")
        self.choices = tuple(choices)

    @property
    def worker_tools(self) -> Sequence[Tool]:
        return [MCP_HOST]

    @contextlib.asynccontextmanager
    async def open(
        self, workers: WorkerPool, owner: str, write: Callable[[EventData], object]
    ) -> AsyncIterator[Sequence[Tool]]:
        # No default timeout: a host call lasts as long as its server.
        executor = ToolExecutor(workers, ToolRegistry([MCP_HOST]))
        servers = [McpServer(c.config, executor, owner=owner) for c in self.choices]
        try:
            started = await asyncio.gather(*(s.start() for s in servers), return_exceptions=True)
            offered: list[Tool] = []
            for choice, server, found in zip(self.choices, servers, started, strict=True):
                name = choice.config.name
                command = tuple(choice.config.command)
                if isinstance(found, McpError):
                    _log.warning("MCP server %r did not start: %s", name, found)
                    write(McpServerEvent(name, command, "failed", reason=str(found)))
                    continue
                if isinstance(found, BaseException):
                    raise found
                tools = _offered(choice, server, found)
                room = MAX_OFFERED - len(offered)
                if len(tools) > room:
                    _log.warning(
                        "MCP server %r offers %d tools; only %d are offered to the model (at "
                        "most %d MCP tools per session): choose them with enabled_tools",
                        name,
                        len(tools),
                        max(room, 0),
                        MAX_OFFERED,
                    )
                    tools = tools[: max(room, 0)]
                offered.extend(tools)
                info = server.info
                write(
                    McpServerEvent(
                        name,
                        command,
                        "started",
                        tuple(t.name for t in tools),
                        server_name=info.name if info else None,
                        server_version=info.version if info else None,
                        capabilities=dict(info.capabilities) if info else None,
                    )
                )
            yield offered
        finally:
            await asyncio.gather(*(s.aclose() for s in servers), return_exceptions=True)


def _offered(choice: ServerChoice, server: McpServer, tools: Sequence[McpTool]) -> list[Tool]:
    out = []
    for found in tools:
        if choice.enabled is not None and found.name not in choice.enabled:
            continue
        if found.name in choice.disabled:
            continue
        name = f"{choice.config.name}{SEPARATOR}{found.name}"
        if not _MODEL_NAME.fullmatch(name):
            _log.warning(
                "MCP server %r: its tool %r is not offered (%r is not a name the model APIs "
                "accept: at most 64 letters, digits, '_' or '-')",
                choice.config.name,
                found.name,
                name,
            )
            continue
        out.append(
            Tool(
                name=name,
                description=found.description or f"{found.name} (MCP server {choice.config.name})",
                parameters=_schema(found.input_schema),
                fn=_runner(server, found.name, choice.tool_timeout),
                kind="supervisor",
                parallel_safe=False,
                extra={"mcp_server": choice.config.name, "mcp_tool": found.name},
            )
        )
    return out


def _schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The tool's input schema as the model sees it: an object schema (the MCP specification
    says it is one; a server that sends none gets an empty one)."""
    if schema.get("type") == "object":
        return schema
    return {"type": "object", "properties": {}}


def _runner(server: McpServer, tool: str, timeout: float | None) -> Any:
    async def run(call: Any) -> ToolOutcome:
        host = call.host
        loop = asyncio.get_running_loop()
        started = loop.time()
        own = AbortController()
        link = call.signal.add_callback(own.abort)
        timer = loop.call_later(timeout, own.abort, Timeout(timeout)) if timeout else None

        def emit(text: str) -> None:
            host.log.publish(ToolOutput(call.call_id, text if text.endswith("\n") else text + "\n"))

        try:
            outcome = await server.call(tool, call.arguments, own.signal, emit)
        except McpError as e:  # the server could not be (re)started: the call never ran
            message = str(e)
            return ToolOutcome(
                call.call_id,
                f"Error: {message}",
                True,
                "not-run",
                loop.time() - started,
                error=ErrorInfo(
                    name="McpServerUnavailable", code=ErrorCode.TOOL_ERROR, message=message
                ),
            )
        finally:
            link.remove()
            if timer is not None:
                timer.cancel()
        ended_by: Any = outcome.ended_by
        if isinstance(own.signal.reason, Timeout) and ended_by != "exit":
            ended_by = f"timeout-{ended_by}"
        duration = loop.time() - started
        return ToolOutcome(call.call_id, outcome.content, outcome.is_error, ended_by, duration)

    return run
