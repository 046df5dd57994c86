"""The supervisor's side of an MCP stdio server: :class:`McpServer` (docs/tools.md, MCP servers).

The server never is the supervisor's child. It runs under a tool worker's containment as the child
of the host program (:mod:`andon.mcp._host`), started by one long ``mcp-host`` call through the
executor; the host connects back over a unix socket in a private folder and relays the server's
stdin and stdout. Over that socket the official SDK's ``ClientSession`` speaks the protocol: one
JSON-RPC message per line, fed to it through anyio memory streams (the SDK's own stdio transport
spawns the server itself, as an asyncio child, which a worker's reaper forbids and which would
put the server outside every containment).

**Stopping.** A call whose signal aborts is cancelled in the protocol first: a
``notifications/cancelled`` naming the call's request id (the SDK sends none of its own while
the call is still awaited), and a ``ping`` behind it. An answer to either within ``term_after``
ends the call by ``interrupt`` (the call's answer, or a stub saying it was cancelled). A server
that answers neither is deaf or stuck: its host call is aborted, whose grace policy sends SIGINT
and SIGTERM to the call's process group at once and SIGKILL ``kill_after`` later, and the call
ends by the stage that ended the server; the next call starts a fresh one.

**Everything is bounded.** The start (connection, ``initialize``, ``tools/list``) within
``startup_timeout``; a server that exits, closes its stdout or writes a line that is not JSON-RPC
ends every call waiting on it at once, with the reason. A server that fails to start
``max_start_failures`` times in a row is disabled, and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast, final

from andon.base import (
    AbortController,
    AbortSignal,
    AndonError,
    CancelStage,
    ConfigError,
    GracePolicy,
    Hook,
    clean_text,
)
from andon.mcp._host_tool import MCP_HOST_NAME, host_command
from andon.supervisor import ExecutionObserver, ToolCallRequest, ToolExecutor, ToolOutcome

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp import ClientSession
    from mcp.shared.message import SessionMessage
    from mcp.types import RequestParamsMeta

__all__ = ["McpError", "McpOutcome", "McpServer", "McpServerConfig", "McpTool"]

_log = logging.getLogger("andon.mcp")

McpEndedBy: TypeAlias = Literal["exit"] | CancelStage
"""How an MCP call ended: answered (``exit``), or by the stage of a stop that ended it."""

_CALL_KEY = "dev.andon/call"
"""A ``_meta`` key on each ``tools/call``: the transport's writer learns the request id the SDK
gave it, which a cancel must name."""

_LINE_LIMIT = 16 * 1024 * 1024
_TAIL = 4096
_EXIT_GRACE = 2.0
"""How long a server whose stdout ended is given to exit before the error names the pipe."""
_STDOUT_CLOSED = "closed its stdout"
_BROKE = "its connection broke"
_CONNECT_GRACE = 5.0
"""How long a token line may take once the host has connected."""


class McpError(AndonError):
    """An MCP server could not be started or used; the message names the server and why."""


@final
@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """The server's whole environment beyond PATH, HOME, LANG and the like (never the
    supervisor's: the model keys must not reach a server)."""
    cwd: str | None = None
    startup_timeout: float = 30.0
    term_after: float = 2.0
    """How long a cancelled call waits for the server to answer before its host is stopped."""
    kill_after: float = 3.0
    """From the host's SIGTERM to its SIGKILL."""
    close_after: float = 2.0
    """How long a closing server is given to exit once its stdin is closed, before its host is
    stopped by the ladder (SIGINT and SIGTERM, then SIGKILL)."""
    max_start_failures: int = 3

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("an MCP server needs a name")
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ConfigError(f"MCP server {self.name!r}: command must be a non-empty argv")
        for key in ("startup_timeout", "term_after", "kill_after", "close_after"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and value >= 0):
                raise ConfigError(f"MCP server {self.name!r}: {key} must be >= 0 seconds")
        if self.max_start_failures < 1:
            raise ConfigError(f"MCP server {self.name!r}: max_start_failures must be >= 1")


@final
@dataclass(frozen=True)
class ServerInfo:
    """What a server says of itself when it starts (``initialize``): its own name and version,
    and its capabilities as JSON."""

    name: str | None
    version: str | None
    capabilities: Mapping[str, Any]


@final
@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: Mapping[str, Any]


@final
@dataclass(frozen=True)
class McpOutcome:
    content: str
    is_error: bool
    ended_by: McpEndedBy


OnOutput = Callable[[str], None]


class _HostObserver(ExecutionObserver):
    """Keeps the tail of the host call's output (the server's stderr) for error messages."""

    def __init__(self) -> None:
        self.tail = b""

    def on_output(self, call_id: str, data: bytes) -> None:
        self.tail = (self.tail + data)[-_TAIL:]

    def text(self) -> str:
        return clean_text(self.tail).strip()


class _Connection:
    """One running server: its host call, the socket, the SDK session over it."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.folder = tempfile.mkdtemp(prefix="andon-mcp-")  # 0700: only we may connect
        self.token = secrets.token_hex(16)
        self.abort = AbortController()
        self.observer = _HostObserver()
        self.host: asyncio.Task[ToolOutcome] | None = None
        self.listener: asyncio.Server | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.ended = asyncio.Event()
        self.end_reason = ""
        self.session: ClientSession | None = None
        self.request_ids: dict[str, Any] = {}
        self.on_log: list[OnOutput] = []
        self._tasks: list[asyncio.Future[Any]] = []
        self._to_session: MemoryObjectSendStream[SessionMessage | Exception] | None = None
        self._stop_session = asyncio.Event()
        self._streams: tuple[Any, ...] = ()
        """The four ends of the session's memory streams, closed with the connection."""

    # -- start -------------------------------------------------------------------------------

    async def open(self) -> list[McpTool]:
        config = self.server.config
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.get_running_loop().create_future()
        )

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if connected.done():
                writer.close()  # one host per server: a second connection is no one's
                return
            connected.set_result((reader, writer))

        sock_path = os.path.join(self.folder, "s")
        self.listener = await asyncio.start_unix_server(accept, sock_path, limit=_LINE_LIMIT)
        spec_path = os.path.join(self.folder, "spec.json")
        spec = {
            "socket": sock_path,
            "token": self.token,
            "argv": list(config.command),
            "env": dict(config.env),
            "cwd": config.cwd,
        }
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        request = ToolCallRequest(
            call_id=f"mcp-{config.name}-{self.server.next_number()}",
            name=MCP_HOST_NAME,
            arguments={"command": host_command(spec_path)},
            cwd=config.cwd or os.getcwd(),
            owner=self.server.owner,
            grace=GracePolicy(term_after=0.0, kill_after=config.kill_after),
        )
        self.host = asyncio.create_task(
            self.server.executor.execute(request, self.abort.signal, self.observer)
        )
        self.host.add_done_callback(self._host_ended)
        ended: asyncio.Future[Any] = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait(
                {connected, ended},
                timeout=self.server.start_deadline - asyncio.get_running_loop().time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ended.cancel()
        if not connected.done() and self.ended.is_set():
            raise McpError(await self.why_ended("before it connected"))
        if not connected.done():
            # The host call waits for a worker (each running server holds one), or its worker
            # is slow to start it: either way, not within the start's bound.
            raise McpError(
                f"MCP server {config.name!r} did not start within {config.startup_timeout:g}s "
                "(its host never connected: is a worker of the pool free?)"
            )
        self.reader, self.writer = connected.result()
        self.listener.close()
        try:
            line = await asyncio.wait_for(self.reader.readline(), _CONNECT_GRACE)
        except (TimeoutError, ValueError, OSError):
            line = b""
        if not hmac.compare_digest(line.strip(), self.token.encode()):
            raise McpError(f"MCP server {config.name!r}: its host did not say the right token")
        return await self._initialize()

    async def _initialize(self) -> list[McpTool]:
        import anyio
        from mcp import ClientSession
        from mcp.shared.message import SessionMessage

        to_session, from_transport = anyio.create_memory_object_stream[SessionMessage | Exception](
            64
        )
        to_transport, from_session = anyio.create_memory_object_stream[SessionMessage](64)
        self._to_session = to_session
        self._streams = (to_session, from_transport, to_transport, from_session)
        self._tasks.append(asyncio.create_task(self._read_loop(to_session)))
        self._tasks.append(asyncio.create_task(self._write_loop(from_session)))
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()

        async def run_session() -> None:
            async def on_log(params: Any) -> None:
                text = f"[{params.level}] {_as_text(params.data)}"
                for callback in list(self.on_log):
                    callback(text)

            async with ClientSession(from_transport, to_transport, logging_callback=on_log) as s:
                ready.set_result(s)
                await self._stop_session.wait()

        session_task: asyncio.Future[Any] = asyncio.create_task(run_session())
        self._tasks.append(session_task)
        ended: asyncio.Future[Any] = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({ready, session_task, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if not ready.done():
            raise McpError(await self.why_ended("before its session began"))
        self.session = ready.result()
        init = await self._bounded(self.session.initialize(), "initialize")
        info = getattr(init, "server_info", None)
        capabilities = getattr(init, "capabilities", None)
        self.server.info = ServerInfo(
            getattr(info, "name", None),
            getattr(info, "version", None),
            capabilities.model_dump(by_alias=True, exclude_none=True) if capabilities else {},
        )
        listed = await self._bounded(self.session.list_tools(), "tools/list")
        return [
            McpTool(t.name, t.description or "", dict(t.input_schema or {})) for t in listed.tools
        ]

    async def _bounded(self, work: Any, what: str) -> Any:
        """Await one request of the start: within what is left of ``startup_timeout``, and not
        past the server's end."""
        task = asyncio.ensure_future(work)
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            done, _ = await asyncio.wait(
                {task, ended},
                timeout=self.server.start_deadline - asyncio.get_running_loop().time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ended.cancel()
        if task in done:
            try:
                return task.result()
            except Exception as e:
                if self.ended.is_set():
                    raise McpError(await self.why_ended(f"before answering {what}")) from None
                raise McpError(
                    f"MCP server {self.server.config.name!r} failed {what}: {e}"
                ) from None
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if self.ended.is_set():
            raise McpError(await self.why_ended(f"before answering {what}"))
        raise McpError(
            f"MCP server {self.server.config.name!r} did not answer {what} within "
            f"{self.server.config.startup_timeout:g}s"
        )

    # -- the transport -----------------------------------------------------------------------

    async def _read_loop(
        self, to_session: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        import anyio
        from mcp import types
        from mcp.shared.message import SessionMessage

        assert self.reader is not None
        try:
            while True:
                try:
                    line = await self.reader.readline()
                except ValueError:
                    self._end(f"wrote a line longer than {_LINE_LIMIT} bytes")
                    return
                except OSError as e:
                    self._end(f"{_BROKE}: {e}")
                    return
                if not line:
                    self._end(_STDOUT_CLOSED)
                    return
                if not line.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError:
                    shown = clean_text(line[:200]).strip()
                    self._end(f"wrote something that is not JSON-RPC: {shown!r}")
                    return
                try:
                    await to_session.send(SessionMessage(message))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
        finally:
            with contextlib.suppress(Exception):
                to_session.close()

    async def _write_loop(self, from_session: MemoryObjectReceiveStream[SessionMessage]) -> None:
        from mcp import types

        assert self.writer is not None
        try:
            async for item in from_session:
                message = item.message
                if isinstance(message, types.JSONRPCRequest) and message.method == "tools/call":
                    meta = (message.params or {}).get("_meta") or {}
                    key = meta.get(_CALL_KEY) if isinstance(meta, dict) else None
                    if isinstance(key, str):
                        self.request_ids[key] = message.id
                data = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                self.writer.write(data.encode())
                await self.writer.drain()
        except (OSError, RuntimeError) as e:
            self._end(f"{_BROKE}: {e}")

    def _end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.end_reason = reason
            self.ended.set()
        if self._to_session is not None:
            # The session's waiting requests fail at once ("connection closed").
            self._to_session.close()

    def _host_ended(self, task: asyncio.Task[ToolOutcome]) -> None:
        if task.cancelled():
            self._end("its host call was cancelled")
            return
        exc = task.exception()
        if exc is not None:
            self._end(f"its host call failed: {exc}")
            return
        outcome = task.result()
        self._end(f"exited ({_exit_words(outcome)})")

    async def settle(self) -> None:
        """The server's stdout ended: give its exit a moment to show, so the reason given is
        the exit status rather than the closed pipe (bounded; the host may live on)."""
        closed = self.end_reason == _STDOUT_CLOSED or self.end_reason.startswith(_BROKE)
        if closed and self.host is not None and not self.host.done():
            await asyncio.wait({self.host}, timeout=_EXIT_GRACE)

    async def why_ended(self, when: str) -> str:
        """Why the server ended, once its exit had a moment to show; with its last output."""
        await self.settle()
        name = self.server.config.name
        reason = self.end_reason or "ended"
        tail = self.observer.text()
        host = self.host
        if host is not None and host.done() and not host.cancelled() and not host.exception():
            outcome = host.result()
            reason = f"exited ({_exit_words(outcome)})"
            if outcome.ended_by == "not-run":
                tail = outcome.content
        message = f"MCP server {name!r} {reason} {when}"
        if tail:
            message += f"; its last output: {_last_lines(tail)}"
        return message

    # -- the end -----------------------------------------------------------------------------

    async def host_outcome(self) -> ToolOutcome | None:
        if self.host is None:
            return None
        with contextlib.suppress(BaseException):
            return await asyncio.shield(self.host)
        return None

    async def close(self, wait: float) -> ToolOutcome | None:
        """Stop the server: close its stdin (the socket) and give it ``wait`` seconds to go, then
        stop the host call (SIGINT and SIGTERM at once, SIGKILL ``kill_after`` later). Returns
        the host call's outcome; leaves no task, socket or file behind."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
        if self.listener is not None:
            self.listener.close()
        outcome: ToolOutcome | None = None
        if self.host is not None:
            done, _ = await asyncio.wait({self.host}, timeout=wait)
            if not done:
                self.abort.abort(Hook(f"MCP server {self.server.config.name!r} stopping"))
            outcome = await self.host_outcome()
        self._end("was closed")
        self._stop_session.set()
        # The streams first: the transport's loops end at once on a closed stream, where they
        # would otherwise wait out their second each (a server gone has nothing more to say).
        for stream in self._streams:
            stream.close()
        for task in self._tasks:
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError, BaseException):
                    await asyncio.wait_for(asyncio.shield(task), 1.0)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            elif not task.cancelled():
                task.exception()  # retrieved: a loop that failed as the server went is no news
        shutil.rmtree(self.folder, ignore_errors=True)
        return outcome


class McpServer:
    """One MCP stdio server, run under a tool worker's containment (docs/tools.md, MCP servers).

    ``executor``'s registry (and its pool's) must hold :data:`~andon.mcp.MCP_HOST`; the server
    holds one worker of the pool while it runs. ``owner`` is the session the host call belongs
    to (its process tag), as for any call."""

    def __init__(
        self, config: McpServerConfig, executor: ToolExecutor, *, owner: str | None = None
    ) -> None:
        tool = executor.registry.get(MCP_HOST_NAME)
        if tool is None:
            raise ConfigError(
                f"MCP server {config.name!r}: the executor's registry has no mcp-host"
            )
        if executor.timeout_for(tool, {}) is not None:
            raise ConfigError(
                f"MCP server {config.name!r}: the executor gives every call a default timeout, "
                "which would end the server; use an executor without one"
            )
        self.config = config
        self.executor = executor
        self.owner = owner
        self.tools: list[McpTool] = []
        self.info: ServerInfo | None = None
        """What the server said of itself in its last ``initialize``."""
        self.disabled: str | None = None
        """Why the server will not be started again (it failed to start too often), or None."""
        self.start_deadline = 0.0
        self._conn: _Connection | None = None
        self._needs_restart = False
        self._failures = 0
        self._numbers = itertools.count(1)
        self._lock = asyncio.Lock()

    def next_number(self) -> int:
        return next(self._numbers)

    @property
    def running(self) -> bool:
        return self._conn is not None and not self._conn.ended.is_set()

    async def start(self) -> list[McpTool]:
        """Start the server (or restart it) and return its tools. Raises :class:`McpError`
        naming why it could not start; nothing of a failed start is left running."""
        async with self._lock:
            return await self._start()

    async def _start(self) -> list[McpTool]:
        if self.disabled is not None:
            raise McpError(self.disabled)
        if self._conn is not None:
            await self._conn.close(0.0)
            self._conn = None
        self.start_deadline = asyncio.get_running_loop().time() + self.config.startup_timeout
        conn = _Connection(self)
        try:
            tools = await conn.open()
        except BaseException as e:
            await conn.close(0.0)
            if isinstance(e, McpError):
                self._failures += 1
                if self._failures >= self.config.max_start_failures:
                    self.disabled = (
                        f"MCP server {self.config.name!r} is disabled: it failed to start "
                        f"{self._failures} times in a row; the last: {e}"
                    )
                    raise McpError(self.disabled) from None
            raise
        self._failures = 0
        self._conn = conn
        self._needs_restart = False
        self.tools = tools
        return tools

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        signal: AbortSignal,
        on_output: OnOutput | None = None,
    ) -> McpOutcome:
        """Call one of the server's tools; starts (or restarts) the server first if it must.

        The answer's content is its text parts joined, other parts as JSON text. A cancel
        through ``signal`` stops the call as the module says; a server that dies during the
        call gives an error outcome saying so. Raises :class:`McpError` only when the server
        cannot be started."""
        async with self._lock:
            if self._conn is None or self._needs_restart or self._conn.ended.is_set():
                await self._start()
            conn = self._conn
        assert conn is not None and conn.session is not None
        emit = on_output or (lambda _text: None)
        key = f"{conn.token[:8]}-{self.next_number()}"

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            of = f"/{total:g}" if total is not None else ""
            emit(f"progress {progress:g}{of}" + (f": {message}" if message else ""))

        conn.on_log.append(emit)
        task = asyncio.ensure_future(
            conn.session.call_tool(
                tool,
                dict(arguments),
                progress_callback=on_progress,
                meta=cast("RequestParamsMeta", {_CALL_KEY: key}),
            )
        )
        try:
            return await self._follow(conn, task, key, signal)
        finally:
            conn.on_log.remove(emit)
            conn.request_ids.pop(key, None)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            elif not task.cancelled():
                # Its failure was answered already (the server went away under the call):
                # retrieved here, so asyncio does not print it as never retrieved.
                task.exception()

    async def _follow(
        self, conn: _Connection, task: asyncio.Future[Any], key: str, signal: AbortSignal
    ) -> McpOutcome:
        aborted = asyncio.ensure_future(signal.wait())
        ended = asyncio.ensure_future(conn.ended.wait())
        try:
            await asyncio.wait({task, aborted, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
            ended.cancel()
        if task.done():
            return await self._answer(conn, task, "exit")
        if not signal.aborted:  # the server ended under the call
            self._needs_restart = True
            return McpOutcome(
                content=f"Error: {await conn.why_ended('during the call')}",
                is_error=True,
                ended_by="exit",
            )
        return await self._cancel(conn, task, key, signal)

    async def _cancel(
        self, conn: _Connection, task: asyncio.Future[Any], key: str, signal: AbortSignal
    ) -> McpOutcome:
        from mcp import types

        assert conn.session is not None
        reason = signal.reason.describe() if signal.reason is not None else "cancelled"
        request_id = conn.request_ids.get(key)
        ping: asyncio.Future[Any] | None = None
        if request_id is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    conn.session.send_notification(
                        types.CancelledNotification(
                            params=types.CancelledNotificationParams(
                                request_id=request_id, reason=reason
                            )
                        )
                    ),
                    self.config.term_after,
                )
            ping = asyncio.ensure_future(conn.session.send_ping())
        waits: set[asyncio.Future[Any]] = {task}
        if ping is not None:
            waits.add(ping)
        ended = asyncio.ensure_future(conn.ended.wait())
        try:
            await asyncio.wait(
                waits | {ended}, timeout=self.config.term_after, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
        pinged = ping is not None and _drop(ping)
        if task.done() and not conn.ended.is_set():
            # Answered (a result, or an error reply): the call ended on the cancel.
            return await self._answer(conn, task, "interrupt")
        if conn.ended.is_set():  # it ended on its own meanwhile: that is the call's end
            self._needs_restart = True
            return McpOutcome(
                content=f"Error: {await conn.why_ended('during the call')}",
                is_error=True,
                ended_by="exit",
            )
        if pinged:
            # The server took the cancel and is listening: it stopped the call (the protocol
            # asks it not to answer a cancelled request).
            return McpOutcome(
                content=f"[cancelled ({reason}); the MCP server acknowledged the cancel]",
                is_error=True,
                ended_by="interrupt",
            )
        # Deaf or stuck: stop the host call by its ladder (SIGINT and SIGTERM at once, then
        # SIGKILL), and start afresh at the next call.
        self._needs_restart = True
        conn.abort.abort(signal.reason or Hook("MCP call cancelled"))
        outcome = await conn.host_outcome()
        stage: McpEndedBy = "term"
        if outcome is not None and outcome.ended_by == "kill":
            stage = "kill"
        return McpOutcome(
            content=f"[cancelled ({reason}); the MCP server did not stop on the cancel: "
            f"andon stopped it ({stage}); it restarts at the next call]",
            is_error=True,
            ended_by=stage,
        )

    async def _answer(
        self, conn: _Connection, task: asyncio.Future[Any], how: McpEndedBy
    ) -> McpOutcome:
        error = task.exception()
        if error is not None:
            if conn.ended.is_set():
                self._needs_restart = True
                return McpOutcome(
                    content=f"Error: {await conn.why_ended('during the call')}",
                    is_error=True,
                    ended_by="exit",
                )
            return McpOutcome(content=f"Error: {error}", is_error=True, ended_by=how)
        result = task.result()
        return McpOutcome(
            content=_content_text(result),
            is_error=bool(getattr(result, "is_error", False)),
            ended_by=how,
        )

    async def aclose(self) -> None:
        """Stop the server (its stdin closed, then the ladder after ``close_after``); nothing of
        it is left. Idempotent."""
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close(self.config.close_after)

    async def __aenter__(self) -> McpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _drop(future: asyncio.Future[Any]) -> bool:
    """Whether ``future`` succeeded; cancelled if still pending, its error read either way (no
    "exception never retrieved" later)."""
    if not future.done():
        future.cancel()
        return False
    return not future.cancelled() and future.exception() is None


def _content_text(result: Any) -> str:
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        if getattr(block, "type", None) == "text":
            parts.append(str(block.text))
        else:
            parts.append(block.model_dump_json(by_alias=True, exclude_none=True))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def _as_text(data: Any) -> str:
    return data if isinstance(data, str) else json.dumps(data, default=str)


def _last_lines(text: str, n: int = 5) -> str:
    return " | ".join(text.splitlines()[-n:])


def _exit_words(outcome: ToolOutcome) -> str:
    if outcome.ended_by == "not-run":
        return "its host did not run"
    if outcome.exit_signal is not None:
        return f"killed by signal {outcome.exit_signal}"
    if outcome.exit_code is not None:
        return f"exit status {outcome.exit_code}"
    return f"ended by {outcome.ended_by}"
