"""A scripted, OpenAI-compatible streaming chat-completions server on 127.0.0.1 (docs/models.md,
The mock server).

``MockModelServer(replies)`` serves the same reply dicts :class:`~andon.llm.Scripted` plays, one
per ``POST …/chat/completions``, as real HTTP/1.1 with chunked Server-Sent Events, so adapter tests
exercise sockets, framing, keep-alive connections and closes instead of a mocked httpx. It also
serves what only a server can do wrong (each documented in docs/models.md): keep-alive comments,
stalls before headers or mid-stream, truncated bodies, malformed chunks, ``{"error": …}`` events,
dropped connections and the two failing finish reasons.

With ``context_window=N`` it is a server with a window (``andon.testing._mock_window``: the
token rule and each provider's refusal); with ``summaries`` it answers summary requests.

With ``strict_reasoning=True`` (``--strict-reasoning`` of :func:`main`) it also enforces DeepSeek
V4's thinking-mode rule the way the real API does: a request with thinking on whose messages hold a
tool-using span with an assistant message lacking ``reasoning_content`` is answered HTTP 400 with
DeepSeek's error body (see :class:`MockModelServer`).

The server runs its own event loop in one thread, so it works from synchronous code
(``with MockModelServer(...)``, ``andon mock-model``) and from async tests (``async with``) alike,
and a client's measurements are not skewed by server work on the client's loop. Stopping cancels
every connection handler and joins the thread: nothing is left behind.

This module is long (about 1,100 lines) because it holds a whole test double in one place: the
validation of the server-only reply options, the HTTP/SSE answers that realise them, and
``main``; each option is defined by its validation and its wire behaviour together.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, final

import yaml

from andon.base import ConfigError, ScriptInvalid
from andon.llm import ReasoningDelta, ScriptParser, ScriptReply, TextDelta, ToolCallDelta
from andon.testing._mock_window import (
    MOCK_BYTES_PER_TOKEN,
    OVERFLOW_SHAPES,
    SUMMARY_MARKER,
    last_text,
    mock_prompt_tokens,
    overflow_answer,
)

__all__ = [
    "OVERFLOW_SHAPES",
    "SERVER_ONLY_FIELDS",
    "SUMMARY_MARKER",
    "MockModelServer",
    "RecordedRequest",
    "main",
    "mock_prompt_tokens",
]

SERVER_ONLY_FIELDS: Final = (
    "usage_chunk",
    "keepalive",
    "keepalive_interval",
    "truncate_after_chunks",
    "malformed_after_chunks",
    "error_event",
    "stall_before_headers",
    "disconnect",
    "raw_events",
)
"""Reply fields only the mock server understands; :class:`~andon.llm.Scripted` rejects them."""

_SERVER_FINISHES: Final = ("content_filter", "insufficient_system_resource")
_ERROR_EVENT_FIELDS: Final = ("after_chunks", "message", "type", "code")
_RAW_COMPANIONS: Final = frozenset(
    {"raw_events", "chunk_delay", "keepalive", "keepalive_interval", "stall_after_chunks"}
)
_ALONE: Final = ("stall_before_headers", "disconnect")
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_balance",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_KEEPALIVE: Final = b": keep-alive\n\n"
_MALFORMED: Final = b'data: {"choices": [{"delta": {"content": "cut \n\n'
_HEADER_LIMIT: Final = 64 * 1024

# --- the script -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ServerReply:
    base: ScriptReply
    finish: str
    usage_chunk: Literal["finish", "separate"] = "finish"
    keepalive: int = 0
    keepalive_interval: float | None = None
    truncate_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    error_event: dict[str, Any] | None = None
    error_event_after: int = 0
    stall_before_headers: bool = False
    disconnect: bool = False
    raw_events: tuple[bytes, ...] | None = None
    usage_wire: dict[str, Any] | None = None  # the script's usage object, sent as it is written


def _parse_replies(raw: object, source: str | None) -> tuple[_ServerReply, ...]:
    parser = ScriptParser(source)
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        parser.fail(None, "replies", f"must be a list of replies, got {type(raw).__name__}")
    return tuple(_parse_reply(parser, index, item) for index, item in enumerate(raw))


def _parse_reply(parser: ScriptParser, index: int, raw: object) -> _ServerReply:
    if not isinstance(raw, Mapping):
        parser.reply(index, raw)  # raises, naming the reply
        raise AssertionError("unreachable")
    server = {str(k): v for k, v in raw.items() if k in SERVER_ONLY_FIELDS}
    rest = {k: v for k, v in raw.items() if k not in SERVER_ONLY_FIELDS}
    finish = rest.get("finish")
    if finish in _SERVER_FINISHES:
        del rest["finish"]
    if "raw_events" in server:
        extra = [str(k) for k in raw if k not in _RAW_COMPANIONS]
        if extra:
            parser.fail(
                index, extra[0], "raw_events replaces the generated stream; drop this field"
            )
    for alone in _ALONE:
        if server.get(alone):
            extra = [str(k) for k in raw if k != alone]
            if extra:
                parser.fail(index, extra[0], f"{alone} sends no stream; drop this field")
    base = parser.reply(index, rest)  # Scripted's own validation of everything else
    if base.error is not None:
        if server:
            parser.fail(
                index, next(iter(server)), "an error reply streams nothing; drop this field"
            )
        if base.error.status is None:
            parser.fail(index, "error.status", "the mock server answers errors over HTTP: give one")
    options: dict[str, Any] = {}
    if "usage_chunk" in server:
        value = server["usage_chunk"]
        if value not in ("finish", "separate"):
            parser.fail(index, "usage_chunk", f"must be finish or separate, got {value!r}")
        options["usage_chunk"] = value
    for name in ("keepalive", "truncate_after_chunks", "malformed_after_chunks"):
        if name in server:
            options[name] = parser.integer(index, name, server[name], minimum=0)
    if "keepalive_interval" in server:
        interval = parser.seconds(index, "keepalive_interval", server["keepalive_interval"])
        if interval <= 0:
            parser.fail(index, "keepalive_interval", "must be > 0")
        options["keepalive_interval"] = interval
    for name in _ALONE:
        if name in server:
            if not isinstance(server[name], bool):
                parser.fail(index, name, f"must be true or false, got {server[name]!r}")
            options[name] = server[name]
    if "error_event" in server:
        options["error_event"], options["error_event_after"] = _error_event(
            parser, index, server["error_event"]
        )
    if "raw_events" in server:
        options["raw_events"] = _raw_events(parser, index, server["raw_events"])
    if base.usage is not None:
        # Validated by the parser; a JSON round trip makes it plain dicts (YAML may nest others).
        options["usage_wire"] = json.loads(json.dumps(rest["usage"]))
    return _ServerReply(base=base, finish=finish or base.finish, **options)


def _error_event(parser: ScriptParser, index: int, raw: object) -> tuple[dict[str, Any], int]:
    if not isinstance(raw, Mapping):
        parser.fail(index, "error_event", f"must be a mapping, got {type(raw).__name__}")
    parser.known_fields(index, "error_event.", raw, _ERROR_EVENT_FIELDS)
    after = parser.integer(index, "error_event.after_chunks", raw.get("after_chunks", 0), minimum=0)
    payload: dict[str, Any] = {
        "message": parser.string(
            index, "error_event.message", raw.get("message", "mock server error")
        )
    }
    if "type" in raw:
        payload["type"] = parser.string(index, "error_event.type", raw["type"])
    if "code" in raw:
        code = raw["code"]
        if not isinstance(code, str | int) or isinstance(code, bool):
            parser.fail(index, "error_event.code", f"must be a string or an integer: {code!r}")
        payload["code"] = code
    return payload, after


def _raw_events(parser: ScriptParser, index: int, raw: object) -> tuple[bytes, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        parser.fail(index, "raw_events", f"must be a list, got {type(raw).__name__}")
    out: list[bytes] = []
    for i, item in enumerate(raw):
        if isinstance(item, Mapping):
            out.append(b"data: " + json.dumps(dict(item)).encode() + b"\n\n")
        elif isinstance(item, str):
            out.append(item.encode() + b"\n\n")
        else:
            parser.fail(index, f"raw_events[{i}]", "must be a string (an SSE block) or a mapping")
    return tuple(out)


def _load_file(path: str | os.PathLike[str]) -> tuple[list[Any], str]:
    """The raw reply list of a YAML or JSON script file (the format Scripted.from_file reads)."""
    name = os.fspath(path)
    file = Path(name)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptInvalid(f"cannot read {name}: {exc}", index=None, field=None) from exc
    try:
        data = json.loads(text) if file.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScriptInvalid(f"cannot parse {name}: {exc}", index=None, field=None) from exc
    if isinstance(data, Mapping):
        for key in data:
            if key != "replies":
                raise ScriptInvalid(
                    f"unknown top-level field; expected replies (in {name})",
                    index=None,
                    field=str(key),
                )
        data = data.get("replies")
    if not isinstance(data, list):
        raise ScriptInvalid(f"must be a list of replies (in {name})", index=None, field="replies")
    return data, name


# --- wire helpers ------------------------------------------------------------------------------


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_LAST_CHUNK: Final = b"0\r\n\r\n"


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    lines = [f"HTTP/1.1 {status} {phrase}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _error_body(message: str, kind: str, code: str | None = None) -> bytes:
    error = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


_REASONING_REQUIRED: Final = (
    "The `reasoning_content` in the thinking mode must be passed back to the API."
)
"""The message of DeepSeek's HTTP 400 when a tool-using span's reasoning is missing."""


def _thinking_enabled(body: Mapping[str, Any]) -> bool:
    """Whether a request body asks for DeepSeek's thinking mode: ``thinking`` absent (the API's
    default is on) or ``{"type": "enabled"}``."""
    thinking = body.get("thinking")
    return thinking is None or (isinstance(thinking, Mapping) and thinking.get("type") == "enabled")


def _missing_reasoning(messages: object) -> int | None:
    """The index of the first assistant message that DeepSeek V4 would reject for lacking
    ``reasoning_content`` (a string; ``""`` counts), or ``None`` if there is none.

    The rule, stated independently of andon's request builder: a span is the messages between two
    ``user`` messages (or the start or end of the list); a span is tool-using when one of its
    assistant messages has non-empty ``tool_calls``; every assistant message of a tool-using span
    must carry its reasoning. ``system`` and ``tool`` messages do not end a span.
    """
    if not isinstance(messages, list):
        return None
    spans: list[list[Mapping[str, Any]]] = [[]]
    positions: list[list[int]] = [[]]
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "user":
            spans.append([])
            positions.append([])
        elif message.get("role") == "assistant":
            spans[-1].append(message)
            positions[-1].append(index)
    for span, where in zip(spans, positions, strict=True):
        if any(m.get("tool_calls") for m in span):
            for message, index in zip(span, where, strict=True):
                if not isinstance(message.get("reasoning_content"), str):
                    return index
    return None


def _seconds_header(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@final
@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request the server received: ``headers`` have lower-case names; ``body`` is the parsed
    JSON (``None`` if it was not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw_body: bytes = field(repr=False, default=b"")
    prompt_tokens: int | None = None
    """The request's prompt tokens by :func:`mock_prompt_tokens` (``None``: not a JSON object)."""


@dataclass(slots=True)
class _Http:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _ClientGone(Exception):
    """The client closed the connection while the server was answering."""


# --- the server ----------------------------------------------------------------------------------


@final
class MockModelServer:
    """Serves ``replies`` (plain dicts, as :class:`~andon.llm.Scripted` takes them, plus the
    server-only fields of :data:`SERVER_ONLY_FIELDS`) at ``{base_url}/chat/completions``.

    Each POST consumes one reply; a request after the last reply gets HTTP 400 saying the script
    is exhausted. Every request is recorded (:attr:`requests`). Use it as ``with`` or
    ``async with``, or call :meth:`start` / :meth:`stop`. The script is validated here, naming the
    reply index and field of any mistake (:class:`~andon.base.ScriptInvalid`).

    Replies stream DeepSeek-style: a reply's ``reasoning`` as ``reasoning_content`` deltas, then
    ``content``, then ``tool_calls``. A reply's ``usage`` is a chat-completions usage object sent
    as written (``total_tokens`` added when absent), so it may take DeepSeek's shape
    (``prompt_cache_hit_tokens``, ``prompt_cache_miss_tokens``,
    ``completion_tokens_details.reasoning_tokens``) or OpenAI's
    (``prompt_tokens_details.cached_tokens``); it rides on the finish chunk unless the reply says
    ``usage_chunk: separate``.

    ``strict_reasoning=True`` enforces DeepSeek V4's thinking-mode rule
    on every request whose ``thinking`` is absent or ``{"type": "enabled"}``: if a span between two
    user messages has an assistant message with tool calls and any assistant message of that span
    lacks a string ``reasoning_content``, the answer is HTTP 400 with DeepSeek's body
    ``{"error": {"message": "The `reasoning_content` in the thinking mode must be passed back to
    the API.", "type": "invalid_request_error", "param": null, "code": "invalid_request_error"}}``.
    Such a request is recorded and counted (:attr:`rejected`) but consumes no reply, as the real
    API rejects it before any model runs. Off by default: the rule is DeepSeek's, not every
    server's.

    ``context_window=N`` makes it a server with a window of ``N`` tokens, counted by the one rule
    of :func:`mock_prompt_tokens`: a request over ``N`` is refused the way the server named by
    ``overflow_shape`` refuses it (one of :data:`OVERFLOW_SHAPES`: ``"openai"``, ``"deepseek"``,
    ``"vllm"``, ``"llamacpp"`` (llama.cpp's C++ server), ``"llama-cpp-python"`` (each an HTTP 400
    with that server's body), or ``"empty-stream"``: HTTP 200 and an event stream that ends
    without any event, as llama-cpp-python's server answers a streamed request). A refused
    request is recorded and counted (:attr:`overflows`) and consumes no reply. With a window, every
    reply's usage says the request's count as ``prompt_tokens`` (the script's usage, if any,
    keeps its other counts; else ``completion_tokens`` is the reply's bytes / 4, rounded up), so a
    client can calibrate its estimate; :attr:`largest_prompt_tokens` is the largest request seen.

    ``summaries="TEXT"`` answers every request whose last message contains
    :data:`SUMMARY_MARKER` with ``TEXT`` (plain text, finish ``stop``) without consuming a
    scripted reply, so a script need not know when a client compacts its history.
    """

    def __init__(
        self,
        replies: Sequence[Mapping[str, Any]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        source: str | None = None,
        strict_reasoning: bool = False,
        context_window: int | None = None,
        overflow_shape: str = "openai",
        summaries: str | None = None,
    ) -> None:
        self._replies = _parse_replies(replies, source)
        if context_window is not None and (
            isinstance(context_window, bool)
            or not isinstance(context_window, int)
            or context_window < 1
        ):
            raise ConfigError(f"context_window must be a whole number >= 1, got {context_window!r}")
        if overflow_shape not in OVERFLOW_SHAPES:
            raise ConfigError(
                f"unknown overflow_shape {overflow_shape!r} (known: {', '.join(OVERFLOW_SHAPES)})"
            )
        self._window = context_window
        self._shape = overflow_shape
        self._summary: _ServerReply | None = None
        if summaries is not None:
            self._summary = _parse_reply(ScriptParser("summaries"), 0, {"text": summaries})
        self._summaries_served = 0
        self._overflows = 0
        self._largest = 0
        self._host = host
        self._port = port
        self._strict_reasoning = strict_reasoning
        self._rejected = 0
        self._cursor = 0
        self._requests: list[RecordedRequest] = []
        self._client_closes = 0
        self._keepalives = 0
        self._connections = 0
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._on_stopped: Callable[[], None] | None = None
        self._finished = False

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        strict_reasoning: bool = False,
        context_window: int | None = None,
        overflow_shape: str = "openai",
        summaries: str | None = None,
    ) -> MockModelServer:
        """A server for a YAML or JSON script file (``{"replies": [...]}`` or a bare list)."""
        replies, name = _load_file(path)
        return cls(
            replies,
            host=host,
            port=port,
            source=name,
            strict_reasoning=strict_reasoning,
            context_window=context_window,
            overflow_shape=overflow_shape,
            summaries=summaries,
        )

    # --- what tests read ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``; the endpoint is ``{base_url}/chat/completions``."""
        if not self._ready.is_set() or self._failure is not None:
            raise RuntimeError("the mock model server is not running")
        return f"http://{self._host}:{self._port}/v1"

    @property
    def port(self) -> int:
        return self._port

    @property
    def requests(self) -> tuple[RecordedRequest, ...]:
        """Every chat-completions request received, in order."""
        with self._lock:
            return tuple(self._requests)

    @property
    def consumed(self) -> int:
        """How many replies have been served."""
        return self._cursor

    @property
    def remaining(self) -> int:
        return len(self._replies) - self._cursor

    @property
    def rejected(self) -> int:
        """How many requests ``strict_reasoning`` refused with DeepSeek's HTTP 400."""
        return self._rejected

    @property
    def context_window(self) -> int | None:
        return self._window

    @property
    def overflows(self) -> int:
        """How many requests were refused for being over :attr:`context_window`."""
        return self._overflows

    @property
    def largest_prompt_tokens(self) -> int:
        """The largest prompt (by :func:`mock_prompt_tokens`) of any request received, refused
        ones included (0 before the first)."""
        return self._largest

    @property
    def summaries_served(self) -> int:
        """How many summary requests were answered with ``summaries``."""
        return self._summaries_served

    @property
    def client_closes(self) -> int:
        """How many answers the client closed before the server had finished them (stalls, or
        a stream cut short)."""
        return self._client_closes

    @property
    def connections(self) -> int:
        """How many TCP connections have been accepted (a client that reuses its connections
        opens one for many requests)."""
        return self._connections

    @property
    def keepalives_sent(self) -> int:
        """How many ``: keep-alive`` comment lines have been sent."""
        return self._keepalives

    async def wait_for_requests(self, n: int = 1, *, timeout: float = 10.0) -> None:
        """Return once ``n`` requests have arrived (TimeoutError after ``timeout`` seconds)."""
        await self._wait_until(lambda: len(self._requests) >= n, timeout, f"{n} request(s)")

    async def wait_for_client_closes(self, n: int = 1, *, timeout: float = 10.0) -> None:
        """Return once the client has closed ``n`` answers early (e.g. after an abort)."""
        await self._wait_until(lambda: self._client_closes >= n, timeout, f"{n} client close(s)")

    async def _wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                if predicate():
                    return
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, future))
            remaining = deadline - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(future, remaining)
                continue
            raise TimeoutError(f"the mock model server did not see {what} within {timeout} s")

    def _changed(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            _resolve_threadsafe(loop, future)

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> MockModelServer:
        """Bind the port and start serving in a thread; returns once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("the mock model server was already started")
        self._thread = threading.Thread(target=self._run, name="andon-mock-model", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure
        return self

    def stop(self) -> None:
        """Close every connection, stop serving and join the thread (idempotent)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._request_stop()
        thread.join()

    async def astop(self) -> None:
        """:meth:`stop` without blocking the caller's event loop while connections close."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._finished:
                self._on_stopped = lambda: _resolve_threadsafe(loop, stopped)
        if self._on_stopped is not None:
            self._request_stop()
            await stopped
        thread.join()  # at most loop.close() is left to run there

    def _request_stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)

    def __enter__(self) -> MockModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> MockModelServer:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port}" if self._ready.is_set() else "not started"
        return f"<MockModelServer {where} reply {self._cursor}/{len(self._replies)}>"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(); the thread must end either way
            self._failure = exc
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            with self._lock:
                self._finished = True
                on_stopped = self._on_stopped
            if on_stopped is not None:
                on_stopped()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, self._host, self._port)
        self._port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            handlers = list(self._handlers)
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()

    # --- HTTP -----------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._connections += 1
        try:
            while True:
                request = await self._read(reader, writer)
                if request is None or not await self._respond(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away between requests
        except asyncio.CancelledError:
            # Only stop() cancels handlers, and this task ends here: ending it normally keeps
            # Python 3.11's start_server callback from logging the cancellation as an error.
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _read(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> _Http | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None  # the client closed an idle connection
        except asyncio.LimitOverrunError:
            await self._send(writer, 431, _error_body("headers too large", "invalid_request"))
            return None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if len(parts) != 3 or "transfer-encoding" in headers:
            await self._send(writer, 400, _error_body("unsupported request", "invalid_request"))
            return None
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            await self._send(writer, 400, _error_body("bad Content-Length", "invalid_request"))
            return None
        body = await reader.readexactly(length) if length else b""
        return _Http(parts[0], parts[1], headers, body)

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        headers = {
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            **(extra or {}),
        }
        writer.write(_head(status, headers) + body)
        await writer.drain()

    async def _respond(
        self, request: _Http, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; return whether the connection may serve another."""
        keep = request.headers.get("connection", "").lower() != "close"
        path = request.path.split("?", 1)[0]
        if request.method != "POST" or not path.endswith("/chat/completions"):
            message = f"no such endpoint: {request.method} {path}; POST …/chat/completions"
            await self._send(writer, 404, _error_body(message, "not_found_error"))
            return keep
        try:
            body: Any = json.loads(request.body)
        except ValueError:
            body = None
        tokens = mock_prompt_tokens(body) if isinstance(body, dict) else None
        over = self._window is not None and tokens is not None and tokens > self._window
        refuse = (
            not over
            and self._strict_reasoning
            and isinstance(body, dict)
            and _thinking_enabled(body)
            and _missing_reasoning(body.get("messages")) is not None
        )
        summary = (
            self._summary is not None
            and isinstance(body, dict)
            and SUMMARY_MARKER in last_text(body.get("messages"))
        )
        with self._lock:
            self._requests.append(
                RecordedRequest(request.method, path, request.headers, body, request.body, tokens)
            )
            if tokens is not None:
                self._largest = max(self._largest, tokens)
            reply = None
            streaming = isinstance(body, dict) and body.get("stream") is True
            if over:
                self._overflows += 1
            elif refuse:
                self._rejected += 1
            elif streaming and summary:
                reply = self._summary
                self._summaries_served += 1
            elif streaming and self._cursor < len(self._replies):
                reply = self._replies[self._cursor]
                self._cursor += 1
        self._changed()
        if not isinstance(body, dict):
            await self._send(writer, 400, _error_body("the body is not a JSON object", "invalid"))
            return keep
        if over:
            assert self._window is not None and tokens is not None
            if self._shape == "empty-stream":
                return await self._empty_stream(keep, reader, writer)
            answer = overflow_answer(self._shape, self._window, tokens, body)
            await self._send(writer, 400, answer)
            return keep
        if refuse:
            kind = "invalid_request_error"
            await self._send(writer, 400, _error_body(_REASONING_REQUIRED, kind, kind))
            return keep
        if body.get("stream") is not True:
            message = "the mock model server only streams: send stream: true"
            await self._send(writer, 400, _error_body(message, "invalid_request_error"))
            return keep
        if reply is None:
            message = f"mock model server: no scripted reply left (all {len(self._replies)} used)"
            await self._send(writer, 400, _error_body(message, "script_exhausted"))
            return keep
        counted = tokens if self._window is not None else None
        try:
            return await self._answer(
                reply, str(body.get("model", "mock")), keep, reader, writer, counted
            )
        except (_ClientGone, ConnectionError):
            self._client_closes += 1
            self._changed()
            return False

    async def _empty_stream(
        self, keep: bool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """HTTP 200, an event-stream content type, and a body that ends without any event."""
        head = {
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked",
        }
        writer.write(_head(200, head))
        try:
            await self._write(writer, reader, None)
        except (_ClientGone, ConnectionError):
            self._client_closes += 1
            self._changed()
            return False
        return keep

    async def _answer(
        self,
        reply: _ServerReply,
        model: str,
        keep: bool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        prompt_tokens: int | None = None,
    ) -> bool:
        if reply.disconnect:
            return False  # the connection closes without an answer
        if reply.stall_before_headers:
            await self._stall(reader, writer, None)
        error = reply.base.error
        if error is not None:
            assert error.status is not None  # checked when the script was loaded
            extra = {}
            if error.retry_after is not None:
                extra["Retry-After"] = _seconds_header(error.retry_after)
            kind = _ERROR_TYPES.get(error.status, "server_error")
            await self._send(writer, error.status, _error_body(error.message, kind), extra)
            return keep
        head = {
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked",
        }
        writer.write(_head(200, head))
        for _ in range(reply.keepalive):
            await self._write(writer, reader, _KEEPALIVE)
            self._keepalives += 1
        delay = reply.base.chunk_delay
        if reply.raw_events is not None:
            stall_at = reply.base.stall_after_chunks
            for n, block in enumerate(reply.raw_events):
                if n == stall_at:
                    await self._stall(reader, writer, reply.keepalive_interval)
                await self._pause(n, delay)
                await self._write(writer, reader, block)
            if stall_at is not None and stall_at >= len(reply.raw_events):
                await self._stall(reader, writer, reply.keepalive_interval)
            await self._write(writer, reader, None)
            return keep
        events = _content_events(reply, model)

        def at(count: int | None) -> int | None:  # "after N chunks" past the end means the end
            return None if count is None else min(count, len(events))

        stall = at(reply.base.stall_after_chunks)
        malformed = at(reply.malformed_after_chunks)
        truncate = at(reply.truncate_after_chunks)
        error_after = at(reply.error_event_after if reply.error_event is not None else None)
        for i in range(len(events) + 1):
            if error_after == i:
                await self._pause(i, delay)
                await self._write(writer, reader, _data({"error": reply.error_event}))
                await self._write(writer, reader, None)
                return keep
            if malformed == i:
                await self._write(writer, reader, _MALFORMED)
            if truncate == i:
                await self._write(writer, reader, None)
                return keep
            if stall == i:
                await self._stall(reader, writer, reply.keepalive_interval)
            if i < len(events):
                await self._pause(i, delay)
                await self._write(writer, reader, _data(events[i]))
        await self._pause(len(events), delay)
        for payload in _closing_events(reply, model, first=not events, prompt_tokens=prompt_tokens):
            await self._write(writer, reader, _data(payload))
        await self._write(writer, reader, b"data: [DONE]\n\n")
        await self._write(writer, reader, None)
        return keep

    async def _pause(self, n: int, delay: float) -> None:
        if n and delay > 0:
            await asyncio.sleep(delay)  # the script's pacing between chunks

    async def _write(
        self, writer: asyncio.StreamWriter, reader: asyncio.StreamReader, block: bytes | None
    ) -> None:
        """Send one SSE block as an HTTP chunk (``None``: end the body)."""
        if reader.at_eof():
            raise _ClientGone  # nothing is read mid-answer, so EOF means the client closed
        writer.write(_chunk(block) if block is not None else _LAST_CHUNK)
        await writer.drain()

    async def _stall(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, interval: float | None
    ) -> None:
        """Send nothing (or only keep-alives) until the client closes; then raise _ClientGone.

        Reading here is safe: a client cannot send its next request before this answer ends.
        """
        gone = asyncio.create_task(_until_eof(reader))
        try:
            while True:
                done, _ = await asyncio.wait({gone}, timeout=interval)
                if done:
                    break
                await self._write(writer, reader, _KEEPALIVE)
                self._keepalives += 1
        finally:
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
        raise _ClientGone


async def _until_eof(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        while await reader.read(65536):
            pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _resolve_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
        loop.call_soon_threadsafe(_resolve, future)


def _data(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def _envelope(model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def _content_events(reply: _ServerReply, model: str) -> list[dict[str, Any]]:
    """One chat-completion chunk per content fragment, DeepSeek-style deltas."""
    separate = {"usage": None} if reply.usage_chunk == "separate" else {}
    events: list[dict[str, Any]] = []
    for chunk in reply.base.content():
        delta: dict[str, Any]
        if isinstance(chunk, ReasoningDelta):
            delta = {"content": None, "reasoning_content": chunk.text}
        elif isinstance(chunk, TextDelta):
            delta = {"content": chunk.text}
        elif isinstance(chunk, ToolCallDelta):
            call: dict[str, Any] = {"index": chunk.index}
            if chunk.name is not None:
                call.update(id=chunk.provider_id, type="function")
                call["function"] = {"name": chunk.name, "arguments": chunk.arguments}
            else:
                call["function"] = {"arguments": chunk.arguments}
            delta = {"tool_calls": [call]}
        else:  # content() yields only deltas
            continue
        delta["role"] = "assistant" if not events else None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        events.append(_envelope(model, [choice], **separate))
    return events


def _closing_events(
    reply: _ServerReply, model: str, *, first: bool, prompt_tokens: int | None = None
) -> list[dict[str, Any]]:
    """The finish chunk, with usage on it or in a separate empty-choices chunk after it.

    ``prompt_tokens`` (a server with a window) replaces the usage's prompt count with the
    server's own, and gives a reply without scripted usage one."""
    usage = reply.base.usage
    usage_json = None
    if usage is not None and reply.usage_wire is not None:
        usage_json = {
            **reply.usage_wire,
            "total_tokens": reply.usage_wire.get(
                "total_tokens", usage.prompt_tokens + usage.completion_tokens
            ),
        }
    if prompt_tokens is not None:
        if usage is not None:
            completion = usage.completion_tokens
        else:
            sent = sum(
                len((c.arguments if isinstance(c, ToolCallDelta) else c.text).encode())
                for c in reply.base.content()
                if isinstance(c, ToolCallDelta | TextDelta | ReasoningDelta)
            )
            completion = math.ceil(sent / MOCK_BYTES_PER_TOKEN)
        usage_json = {
            **(usage_json or {}),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
    delta: dict[str, Any] = {"role": "assistant"} if first else {"content": ""}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reply.finish}
    if reply.usage_chunk == "finish":
        extra = {"usage": usage_json} if usage_json is not None else {}
        return [_envelope(model, [choice], **extra)]
    events = [_envelope(model, [choice], usage=None)]
    if usage_json is not None:
        events.append(_envelope(model, [], usage=usage_json))
    return events


# --- andon mock-model ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``andon mock-model --script FILE [--port N] [--host H] [--strict-reasoning]
    [--context-window N] [--overflow-shape SHAPE]``: serve until SIGINT or SIGTERM (the options
    are those of the class).

    The first line on stdout is the base URL (``http://127.0.0.1:PORT/v1``). Exit status 0 after
    a signal, 2 for a bad script, 1 if the port cannot be bound.
    """
    parser = argparse.ArgumentParser(
        prog="andon mock-model",
        description="Serve a model script as an OpenAI-compatible streaming endpoint.",
    )
    parser.add_argument("--script", required=True, help="YAML or JSON script of replies")
    parser.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    parser.add_argument(
        "--strict-reasoning",
        action="store_true",
        help="answer HTTP 400 like DeepSeek V4 when a tool-using span's reasoning_content is "
        "missing (requests with thinking on)",
    )
    parser.add_argument(
        "--context-window",
        type=int,
        metavar="N",
        help="refuse requests over N tokens (the mock's count: JSON bytes / 4)",
    )
    parser.add_argument(
        "--overflow-shape",
        choices=OVERFLOW_SHAPES,
        default="openai",
        help="how a request over the window is refused (default: openai)",
    )
    args = parser.parse_args(argv)
    try:
        server = MockModelServer.from_file(
            args.script,
            host=args.host,
            port=args.port,
            strict_reasoning=args.strict_reasoning,
            context_window=args.context_window,
            overflow_shape=args.overflow_shape,
        )
    except ConfigError as exc:
        print(f"andon mock-model: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda _signum, _frame: stop.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            server.start()
        except OSError as exc:
            print(
                f"andon mock-model: cannot listen on {args.host}:{args.port}: {exc}",
                file=sys.stderr,
            )
            return 1
        print(server.base_url, flush=True)
        stop.wait()  # a signal handler sets it; lock waits are interrupted by signals on POSIX
        return 0
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
