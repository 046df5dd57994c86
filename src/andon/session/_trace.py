"""A session's log as a tree of spans (docs/traces.md): the shape an OpenTelemetry exporter sends.

Everything here comes from the log, the source of truth: a span starts at the time of the record
that opens it and ends at the time of the record that closes it, so exporting the same log twice
gives the same spans. The ids are derived too: the trace id from the session id, a span id from the
session id and the seq of the record that opens the span.

The tree: the session; under it each turn (``turn/start`` … ``turn/end``); under a turn each step
(``step/start`` … ``step/end``); under a step each model request (``llm/request`` until its
``llm/retry``, ``assistant/message`` or the step's end) and each tool call (``tool/call`` …
``tool/result``), whose ``tool/signal`` stages become events. A span the log leaves open (a
crashed session read without repair's closers) ends at the last record and says so in
``andon.unfinished``.

No OpenTelemetry import here: this is plain data; ``andon trace`` and ``andon run`` hand it to the
SDK.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

from andon.session._records import Record

__all__ = ["Span", "SpanEvent", "Trace", "span_id_for", "trace_id_for", "trace_of"]

Attributes = dict[str, str | bool | int | float | tuple[str, ...]]


@final
@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A point in a span's time: a tool call's stop stage (``interrupt``, ``term``, ``kill`` …)."""

    name: str
    time: float
    attributes: Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class Span:
    """One span, times in unix seconds as the log has them. ``error`` is the status: None for
    OK, else the reason the span is an error (a stopped, failed or killed tool call, say)."""

    span_id: int
    parent_id: int | None
    name: str
    start: float
    end: float
    attributes: Mapping[str, Any]
    events: tuple[SpanEvent, ...]
    error: str | None


@dataclass(slots=True)
class _Open:
    """A span while the log is read: its end, status and attributes are filled in later."""

    span_id: int
    parent_id: int | None
    name: str
    start: float
    end: float | None = None
    attributes: Attributes = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    error: str | None = None


@final
@dataclass(frozen=True, slots=True)
class Trace:
    """The spans of one session, parents before children."""

    session_id: str
    trace_id: int
    spans: tuple[Span, ...]


def _digest(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid in OpenTelemetry


def trace_id_for(session_id: str) -> int:
    """The 128-bit trace id of a session: the same session always gets the same trace."""
    return _digest(f"andon-trace:{session_id}", 16)


def span_id_for(session_id: str, seq: int) -> int:
    """The 64-bit span id of the span opened by record ``seq`` of a session."""
    return _digest(f"andon-span:{session_id}:{seq}", 8)


def _reason_text(reason: Mapping[str, Any]) -> tuple[str, str | None]:
    """A ``turn/end`` reason as (kind, error description or None for a completed turn)."""
    kind = str(reason.get("kind", "?"))
    match kind:
        case "completed":
            return kind, None
        case "aborted":
            cause = reason.get("reason")
            what = cause.get("kind") if isinstance(cause, Mapping) else None
            return kind, f"aborted ({what})" if what else "aborted"
        case "error":
            error = reason.get("error")
            if isinstance(error, Mapping):
                return kind, f"{error.get('code')}: {error.get('message')}"
            return kind, "error"
        case "blocked":
            return kind, f"blocked by {reason.get('by')}"
        case "interrupted":
            return kind, "interrupted: andon stopped without ending the turn (repaired)"
        case _:
            return kind, kind


def _tool_error(data: Mapping[str, Any]) -> str | None:
    """Why a tool call is an error, or None when it completed."""
    if not data.get("is_error"):
        return None
    ended_by = data.get("ended_by")
    how = f" (ended by {ended_by})" if ended_by else ""
    error = data.get("error")
    if isinstance(error, Mapping):
        return f"{error.get('code')}: {error.get('message')}{how}"
    exit_status = data.get("exit")
    if isinstance(exit_status, Mapping):
        if exit_status.get("signal") is not None:
            return f"exited with signal {exit_status['signal']}{how}"
        return f"exit code {exit_status.get('code')}{how}"
    return f"failed{how}"


class _Builder:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.spans: list[_Open] = []
        self.root: _Open | None = None
        self.turns: dict[int, _Open] = {}
        self.steps: dict[tuple[int, int], _Open] = {}
        self.requests: dict[tuple[int, int], _Open] = {}  # the open model request of a step
        self.calls: dict[str, _Open] = {}
        self.provider = ""
        self.last = 0.0

    def open(self, record: Record, parent: _Open | None, name: str, **attrs: Any) -> _Open:
        span = _Open(
            span_id_for(self.session_id, record.seq),
            None if parent is None else parent.span_id,
            name,
            record.time,
            attributes={"andon.seq": record.seq, **attrs},
        )
        self.spans.append(span)
        return span

    def parent_step(self, data: Mapping[str, Any]) -> _Open | None:
        turn, step = int(data["turn"]), int(data["step"])
        return self.steps.get((turn, step)) or self.turns.get(turn) or self.root

    def end_request(self, key: tuple[int, int], time: float, error: str | None) -> None:
        request = self.requests.pop(key, None)
        if request is not None:
            request.end, request.error = time, error

    def feed(self, record: Record) -> None:
        obj = record.to_dict()
        kind, data = obj["type"], obj["data"]
        self.last = max(self.last, record.time)
        match kind:
            case "session/start":
                model = data.get("model", {})
                self.provider = str(model.get("provider", ""))
                self.root = self.open(
                    record,
                    None,
                    "andon session",
                    **{
                        "gen_ai.conversation.id": self.session_id,
                        "andon.session.id": self.session_id,
                        "andon.version": str(data.get("andon_version", "")),
                        "andon.model": str(model.get("spec", "")),
                        "andon.host": str(data.get("host", "")),
                        "andon.pid": int(data.get("pid", 0)),
                        "andon.cwd": str(data.get("cwd", "")),
                    },
                )
            case "session/repaired" if self.root is not None:
                self.root.attributes["andon.session.repaired"] = True
            case "turn/start":
                turn = int(data["turn"])
                self.turns[turn] = self.open(
                    record,
                    self.root,
                    f"turn {turn}",
                    **{"andon.turn": turn, "gen_ai.conversation.id": self.session_id},
                )
            case "turn/end":
                span = self.turns.pop(int(data["turn"]), None)
                if span is not None:
                    ended, error = _reason_text(data.get("reason", {}))
                    span.end, span.error = record.time, error
                    span.attributes["andon.turn.ended"] = ended
                    if self.root is not None:  # the session says how its last turn ended
                        self.root.error = error
                        self.root.attributes["andon.turn.ended"] = ended
            case "step/start":
                turn, step = int(data["turn"]), int(data["step"])
                self.steps[turn, step] = self.open(
                    record,
                    self.turns.get(turn, self.root),
                    f"step {turn}.{step}",
                    **{"andon.turn": turn, "andon.step": step},
                )
            case "step/end":
                key = (int(data["turn"]), int(data["step"]))
                self.end_request(key, record.time, "the step ended before the reply")
                span = self.steps.pop(key, None)
                if span is not None:
                    span.end = record.time
            case "llm/request":
                key = (int(data["turn"]), int(data["step"]))
                model = str(data.get("model", ""))
                self.requests[key] = self.open(
                    record,
                    self.parent_step(data),
                    f"chat {model}",
                    **{
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": model,
                        "gen_ai.provider.name": self.provider,
                        "gen_ai.conversation.id": self.session_id,
                        "andon.turn": key[0],
                        "andon.step": key[1],
                        "andon.llm.attempt": int(data.get("attempt", 1)),
                    },
                )
            case "llm/retry":
                key = (int(data["turn"]), int(data["step"]))
                error = data.get("error", {})
                code = str(error.get("code", "?"))
                request = self.requests.get(key)
                if request is not None:
                    request.attributes["error.type"] = code
                    request.attributes["andon.llm.retry_delay"] = float(data.get("delay", 0.0))
                message = error.get("message")
                self.end_request(key, record.time, f"{code}: {message}" if message else code)
            case "assistant/message":
                key = (int(data["turn"]), int(data["step"]))
                request = self.requests.get(key)
                if request is None:
                    return
                finish = str(data.get("finish", ""))
                request.attributes["gen_ai.response.finish_reasons"] = (finish,)
                usage = data.get("usage") or {}
                for ours, theirs in (
                    ("gen_ai.usage.input_tokens", "prompt_tokens"),
                    ("gen_ai.usage.output_tokens", "completion_tokens"),
                ):
                    if isinstance(usage.get(theirs), int):
                        request.attributes[ours] = usage[theirs]
                error = "aborted: the reply was interrupted" if finish == "aborted" else None
                self.end_request(key, record.time, error)
            case "tool/call":
                call_id, name = str(data["call_id"]), str(data.get("name", ""))
                self.calls[call_id] = self.open(
                    record,
                    self.parent_step(data),
                    f"execute_tool {name}",
                    **{
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": name,
                        "gen_ai.tool.call.id": call_id,
                        "andon.turn": int(data["turn"]),
                        "andon.step": int(data["step"]),
                    },
                )
            case "tool/started":
                span = self.calls.get(str(data["call_id"]))
                if span is not None:
                    for name in ("worker", "host", "pid", "pgid", "containment"):
                        if data.get(name) is not None:
                            span.attributes[f"andon.tool.{name}"] = data[name]
                    span.events.append(SpanEvent("started", record.time, {}))
            case "tool/signal":
                span = self.calls.get(str(data["call_id"]))
                if span is not None:
                    span.events.append(
                        SpanEvent(
                            str(data["stage"]),
                            record.time,
                            {
                                "andon.signal.at": float(data.get("at", 0.0)),
                                "andon.signal.targets": int(data.get("targets", 0)),
                            },
                        )
                    )
            case "tool/result":
                call_id = str(data["call_id"])
                span = self.calls.pop(call_id, None)
                if span is None:  # a call that never started (repair's TOOL_NOT_STARTED)
                    span = self.open(
                        record,
                        self.parent_step(data),
                        "execute_tool",
                        **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": call_id},
                    )
                span.end, span.error = record.time, _tool_error(data)
                attrs = span.attributes
                attrs["andon.ended_by"] = str(data.get("ended_by") or "exit")
                error = data.get("error")
                if isinstance(error, Mapping):
                    attrs["error.type"] = str(error.get("code"))
                exit_status = data.get("exit")
                if isinstance(exit_status, Mapping):
                    for name in ("code", "signal"):
                        if exit_status.get(name) is not None:
                            attrs[f"andon.tool.exit.{name}"] = int(exit_status[name])
                for name in ("duration", "strays_killed", "output_bytes"):
                    if data.get(name) is not None:
                        attrs[f"andon.tool.{name}"] = data[name]
                if record.synthetic:
                    attrs["andon.synthetic"] = str(record.synthetic)
            case _:
                pass

    def finish(self) -> tuple[Span, ...]:
        for span in self.spans:
            if span.end is None and span is not self.root:
                span.end = self.last
                span.attributes["andon.unfinished"] = True
        if self.root is not None:
            self.root.end = self.last
        return tuple(
            Span(
                s.span_id,
                s.parent_id,
                s.name,
                s.start,
                self.last if s.end is None else s.end,
                dict(s.attributes),
                tuple(s.events),
                s.error,
            )
            for s in self.spans
        )


def trace_of(records: Iterable[Record]) -> Trace:
    """The trace of a session's records (``read(folder)``, plus repair's closers for a crashed
    one). The first record must be the ``session/start``; ``ValueError`` otherwise."""
    it = iter(records)
    first = next(it, None)
    if first is None or first.type != "session/start":
        raise ValueError("the log does not begin with session/start")
    session_id = str(first.to_dict()["data"]["session_id"])
    builder = _Builder(session_id)
    builder.feed(first)
    for record in it:
        builder.feed(record)
    return Trace(session_id, trace_id_for(session_id), builder.finish())
