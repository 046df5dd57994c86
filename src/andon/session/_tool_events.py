"""The data of the tool records: ``tool/call``, ``tool/started``, ``tool/signal``, ``tool/result``,
and ``mcp/server`` (a session's tool server).

Written by the executor (and ``tool/result`` also by crash repair); their JSON:
docs/log-format.md, Tool calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, final

from andon.base import Containment, EndedBy, SignalStage
from andon.session._values import OMIT, PID, CallData, ExitStatus, RecordData, ToolErrorInfo

__all__ = ["McpServerEvent", "ToolCall", "ToolResult", "ToolSignal", "ToolStarted"]


@final
@dataclass(frozen=True, slots=True)
class ToolCall(CallData, record_type="tool/call"):
    """``tool/call``: the executor is about to start the call (or is skipping it)."""

    name: str
    arguments: str


@final
@dataclass(frozen=True, slots=True)
class ToolStarted(CallData, record_type="tool/started"):
    """``tool/started``: the worker reports the tool's process running.

    ``pid`` + ``create_time`` identify the leader even if the pid is reused later; ``pgid`` is its
    process group; ``cgroup`` the call's own cgroup where there is one. Crash repair uses them to
    find leftovers.
    """

    worker: str
    host: str
    pid: Annotated[int, PID]
    pgid: Annotated[int, PID]
    create_time: float
    containment: Annotated[Containment | None, OMIT] = None
    cgroup: Annotated[str | None, OMIT] = None


@final
@dataclass(frozen=True, slots=True)
class ToolSignal(CallData, record_type="tool/signal"):
    """``tool/signal``: a grace stage or sweep signal sent ``at`` seconds into the call."""

    stage: SignalStage
    at: float
    targets: int


@final
@dataclass(frozen=True, slots=True)
class ToolResult(CallData, record_type="tool/result"):
    """``tool/result``: the one result of a call. ``content`` is what the model sees.

    ``error`` is present only for andon errors (docs/log-format.md, Error codes);
    ``exit`` only when a process ran; ``output_file`` (relative to the session folder) when the
    output was spilled.
    """

    content: str
    is_error: bool
    duration: float
    error: Annotated[ToolErrorInfo | None, OMIT] = None
    exit: Annotated[ExitStatus | None, OMIT] = None
    ended_by: Annotated[EndedBy | None, OMIT] = None
    strays_killed: Annotated[int | None, OMIT] = None
    output_bytes: Annotated[int | None, OMIT] = None
    output_file: Annotated[str | None, OMIT] = None
    json_keys: ClassVar = (
        "turn",
        "step",
        "call_id",
        "content",
        "is_error",
        "error",
        "exit",
        "ended_by",
        "strays_killed",
        "output_bytes",
        "output_file",
        "duration",
    )


@final
@dataclass(frozen=True, slots=True)
class McpServerEvent(RecordData, record_type="mcp/server"):
    """``mcp/server``: an MCP server the session started with it (``state`` ``started``: what it
    said of itself, and the tools of it offered to the model as ``NAME__tool``), or could not
    start (``failed``, with ``reason``). Written ignorable, between turns, once the session opens
    (docs/log-format.md, MCP servers): an andon that does not know it skips it."""

    name: str
    command: tuple[str, ...]
    state: Literal["started", "failed"]
    tools: tuple[str, ...] = ()
    server_name: Annotated[str | None, OMIT] = None
    server_version: Annotated[str | None, OMIT] = None
    capabilities: Annotated[Mapping[str, Any] | None, OMIT] = None
    reason: Annotated[str | None, OMIT] = None
    json_keys: ClassVar = (
        "name",
        "command",
        "state",
        "server_name",
        "server_version",
        "capabilities",
        "tools",
        "reason",
    )
