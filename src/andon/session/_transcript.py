"""The transcript a person reads (``andon log``): plain text, one pass over the log."""

from __future__ import annotations

import json
import shlex
import time as _time
from collections.abc import Iterable, Mapping
from typing import Any, assert_never

from andon.base import ENDED_BY, ErrorCode, plural
from andon.session._events import ProjectInstructions
from andon.session._live import AgentEvent
from andon.session._reader import without_live_only
from andon.session._records import (
    AssistantChunk,
    AssistantMessage,
    ContextCompacted,
    ContextTrimmed,
    InboxSpliced,
    LlmRequest,
    LlmRetry,
    McpServerEvent,
    Record,
    SessionRepaired,
    SessionResumed,
    SessionStart,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnEnd,
    TurnStart,
    Unrecognized,
    UserMessageEntered,
    as_records,
)
from andon.session._values import describe_reason

__all__ = ["render_transcript"]

OUTPUT_HEAD = 4
OUTPUT_TAIL = 8  # a build's error is at its end: the tail is what a reader needs most
# Every way a call can end but its own exit and never running: something stopped it.
_STOPPING = ENDED_BY - {"exit", "not-run"}
_STAGE_SIGNAL = {
    "interrupt": "SIGINT",
    "term": "SIGTERM",
    "kill": "SIGKILL",
    "sweep-term": "SIGTERM (sweep)",
    "sweep-kill": "SIGKILL (sweep)",
}


def _clock(t: float) -> str:
    return _time.strftime("%H:%M:%S", _time.gmtime(t))


def _stamp(t: float) -> str:
    return _time.strftime("%Y-%m-%d %H:%M:%S UTC", _time.gmtime(t))


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line for line in (text.splitlines() or [""])]


ARGUMENTS_LIMIT = 120


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n >= 1024 else plural(n, "byte")


def _arguments(name: str, raw: str) -> str:
    """A tool call's arguments as a person reads them: a command as the command (its first line,
    then ``…``), anything else as ``key=value`` pairs (a value as JSON unless it is a plain
    word), cut at :data:`ARGUMENTS_LIMIT` characters."""
    try:
        args = json.loads(raw)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        text = " ".join(raw.split())
    elif isinstance(args.get("command"), str) and (name == "bash" or len(args) == 1):
        lines = args["command"].strip().splitlines() or [""]
        text = "$ " + lines[0] + (" …" if len(lines) > 1 else "")
    else:
        text = " ".join(f"{key}={_value(value)}" for key, value in args.items())
    return text if len(text) <= ARGUMENTS_LIMIT else text[: ARGUMENTS_LIMIT - 1] + "…"


def _value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in "\"'=" for c in value):
        return value
    return " ".join(json.dumps(value, ensure_ascii=False).split())


def _quote(text: str, limit: int = 80) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= limit else one[: limit - 1] + "…")


class _Render:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.turn_time: dict[int, float] = {}
        self.open_turn: int | None = None
        self.open_step: tuple[int, int] | None = None
        self.chunks = 0
        self.replied = False
        # Lines true only while the session runs: a call's "running: pid …" (until its result)
        # and a queued message (until it is entered or the session is between turns). A finished
        # session's transcript leaves them out (their indices into ``lines``).
        self.running: dict[str, int] = {}
        self.queued: list[tuple[int, str]] = []
        self.dropped: set[int] = set()

    def add(self, line: str) -> None:
        self.lines.append(line)

    def _instructions(self, added: ProjectInstructions | None) -> None:
        """The project instructions in the prompt: each file, its size and a short hash."""
        if added is None:
            return
        self.add(f"  project instructions from {added.root}:")
        for f in added.files:
            cut = ", truncated" if f.truncated else ""
            self.add(f"    {f.path} · {plural(f.bytes, 'byte')}{cut} · sha256 {f.sha256[:12]}")

    def feed(self, r: Record) -> None:
        data = r.data
        repair = " (written by crash repair)" if r.synthetic == "repair" else ""
        match data:
            case SessionStart():
                self.add(
                    f"session {data.session_id} · started {_stamp(data.created)} · model "
                    f"{data.model.spec} · pid {data.pid} on {data.host}"
                )
                self.add(f"  cwd {data.cwd}")
                self._instructions(data.project_instructions)
            case SessionResumed():
                how = ", after crash repair" if data.repaired else ""
                self.add("")
                self.add(
                    f"resumed {_stamp(r.time)} by pid {data.pid} on {data.host} (model "
                    f"{data.model.spec}{how})"
                )
                self._instructions(data.project_instructions)
            case SessionRepaired():
                parts = [f"{plural(data.closers, 'closing record')} appended"]
                if data.torn_bytes:
                    parts.append(f"{data.torn_bytes} torn bytes moved to {data.torn_file}")
                if data.killed_leftovers:
                    parts.append(f"{plural(data.killed_leftovers, 'leftover process')} killed")
                self.add(f"session repaired after a crash: {'; '.join(parts)}")
            case InboxSpliced():
                self._splice(data)
            case TurnStart(turn=turn):
                self.turn_time[turn] = r.time
                self.open_turn = turn
                self.add("")
                self.add(f"turn {turn} · {_clock(r.time)}")
            case TurnEnd(turn=turn, reason=reason):
                took = ""
                started = self.turn_time.pop(turn, None)
                if started is not None and not repair:  # repair ran long after the process died
                    took = f" after {r.time - started:.2f}s"
                self.add(f"  turn {turn} ended{took}: {describe_reason(reason)}{repair}")
                self.open_turn = None
            case StepStart(turn=turn, step=step):
                self.open_step = (turn, step)
                self.chunks, self.replied = 0, False
                self.add(f"  step {step}")
            case StepEnd():
                if self.chunks and not self.replied:
                    self.add(
                        f"    (the reply was cut off: {plural(self.chunks, 'chunk')} streamed, "
                        "nothing kept)"
                    )
                self.open_step = None
            case UserMessageEntered(message=message):
                self._entered(message.content)
                label = "user" if message.source == "user" else f"user ({message.source})"
                self.lines.extend(_indent(message.content, f"    {label}: "))
            case LlmRequest(attempt=attempt, model=model):
                if attempt > 1:
                    self.add(f"    model request, attempt {attempt} ({model})")
            case LlmRetry(error=error, delay=delay, attempt=attempt):
                code = error.get("code", "error")
                self.add(
                    f"    model request attempt {attempt} failed ({code}: "
                    f"{error.get('message', '')}); retrying in {delay:.2f}s"
                )
            case AssistantChunk():
                self.chunks += 1
            case AssistantMessage():
                self._reply(data)
            case ToolCall(call_id=call_id, name=name, arguments=arguments):
                self.add(f"    tool {call_id} {name} {_arguments(name, arguments)}")
            case ToolStarted(call_id=call_id, pid=pid, worker=worker, host=host):
                self.running[call_id] = len(self.lines)
                self.add(f"      running: pid {pid} on {host} (worker {worker})")
            case ToolSignal(stage=stage, at=at, targets=targets):
                signame = _STAGE_SIGNAL.get(stage, stage)
                self.add(f"      {signame} at +{at:.2f}s to {plural(targets, 'process')}")
            case ToolResult():
                self._result(data, repair)
            case ContextTrimmed(calls=calls, tokens_before=before, tokens_after=after):
                pad = "    " if data.step is not None else "  "
                self.add(
                    f"{pad}context trimmed: {plural(len(calls), 'older tool output')} now shown "
                    f"as a stub (~{before} → ~{after} tokens of a {data.window}-token window)"
                )
            case ContextCompacted():
                pad = "    " if data.step is not None else "  "
                self.add(
                    f"{pad}context compacted: {plural(data.replaced, 'earlier message')} "
                    f"summarised by {data.model} (~{data.tokens_before} → ~{data.tokens_after} "
                    f"tokens of a {data.window}-token window)"
                )
                self.lines.extend(_indent(data.summary, f"{pad}  summary: "))
            case McpServerEvent():
                self.add(_server_line(data))
            case Unrecognized(record_type=record_type):
                self.add(f"    ({record_type}: a record of a newer andon, skipped)")
            case _:
                assert_never(data)

    def _splice(self, data: InboxSpliced) -> None:
        if data.outcome == "canceled":
            self.add(
                f"  queued work discarded unrun: {plural(data.removed, 'message')} from "
                f"{data.target}"
            )
            return
        if data.inserted and not data.removed:
            for message in data.inserted:
                self.queued.append((len(self.lines), message.content))
                self.add(f"  queued ({data.target}, {message.source}): {_quote(message.content)}")
        elif data.removed and not data.inserted and self.open_turn is None:
            self.add(f"  {plural(data.removed, 'queued message')} removed from {data.target}")
        elif data.removed and data.inserted:
            self.add(f"  {plural(data.removed, 'queued message')} replaced in {data.target}")

    def _entered(self, content: str) -> None:
        """A queued message that is now entered is no longer queued: its line goes."""
        for n, (index, queued) in enumerate(self.queued):
            if queued == content:
                self.dropped.add(index)
                del self.queued[n]
                return

    def _reply(self, data: AssistantMessage) -> None:
        self.replied = True
        mark = " [interrupted]" if data.interrupted else ""
        reasoning = data.message.reasoning
        if reasoning:
            self.lines.extend(_indent(reasoning, f"    thinking{mark}: "))
        text = data.message.text
        if text:
            self.lines.extend(_indent(text, f"    assistant{mark}: "))
        if not text and not reasoning and not data.message.tool_calls:
            self.add(f"    assistant{mark}: (no text)")
        if data.finish == "length":
            dropped = data.dropped_tool_calls or 0
            note = f"; {plural(dropped, 'tool call')} dropped" if dropped else ""
            self.add(f"    (the reply hit the output limit{note})")

    def _result(self, data: ToolResult, repair: str) -> None:
        running = self.running.pop(data.call_id, None)
        if running is not None:
            self.dropped.add(running)  # the call is over: where it ran is past
        parts: list[str] = []
        if data.exit is not None:
            if data.exit.signal is not None:
                parts.append(f"signal {data.exit.signal}")
            else:
                parts.append(f"exit {data.exit.code}")
        code = data.error.code if data.error is not None else None
        if code not in (ErrorCode.TOOL_OUTCOME_UNKNOWN, ErrorCode.TOOL_NOT_STARTED):
            parts.append(f"after {data.duration:.2f}s")  # repair results never saw the call end
        stopped = data.ended_by in _STOPPING or code in (ErrorCode.ABORTED, ErrorCode.TOOL_TIMEOUT)
        head = "[stopped] " if stopped else ""
        if data.ended_by is not None and data.ended_by != "exit":
            parts.append(f"ended by {data.ended_by}")
        if data.strays_killed:
            parts.append(f"{plural(data.strays_killed, 'stray')} killed")
        status = "error" if data.is_error else "ok"
        line = f"      {head}result {data.call_id}: {', '.join([status, *parts])}"
        if data.error is not None:
            line += f" · {data.error.code}: {data.error.message}"
        self.add(line + repair)
        out = data.content.splitlines()
        shown = out
        if len(out) > OUTPUT_HEAD + OUTPUT_TAIL + 1:  # eliding a single line would save nothing
            omitted = len(out) - OUTPUT_HEAD - OUTPUT_TAIL
            kept = len(data.content.encode("utf-8", "surrogateescape"))
            whole = data.output_bytes
            if whole is not None and whole > kept:
                # The log holds the model's copy of a longer output: say which one is counted.
                marker = (
                    f"… {plural(omitted, 'line')} of the log's {_kib(kept)} copy omitted (the "
                    f"tool printed {_kib(whole)}) …"
                )
            else:
                marker = f"… {plural(omitted, 'line')} of the output omitted …"
            shown = [*out[:OUTPUT_HEAD], marker, *out[-OUTPUT_TAIL:]]
        for text in shown:
            self.add(f"      | {text}")
        if data.output_file is not None:
            size = f" ({data.output_bytes} bytes)" if data.output_bytes is not None else ""
            self.add(f"      full output: {data.output_file}{size}")

    def finish(self) -> str:
        if self.open_turn is not None:
            self.add(
                f"  turn {self.open_turn} is still open: the session is running, or its process "
                "died and the next load repairs it"
            )
        else:
            self.dropped.update(index for index, _ in self.queued)
        return "".join(line + "\n" for n, line in enumerate(self.lines) if n not in self.dropped)


def render_transcript(events: Iterable[AgentEvent | Mapping[str, Any]]) -> str:
    """The transcript of a log as a person reads it (``andon log``).

    Turns and steps, user messages, the assistant's text (and reasoning), tool calls with their
    exit status and duration, ``[stopped]`` markers, how each turn ended, and queued work that a
    cancel discarded unrun. Plain text; one pass.
    """
    render = _Render()
    for record in as_records(without_live_only(events)):  # an ``andon run --json`` file's lines too
        render.feed(record)
    return render.finish()


def _server_line(data: McpServerEvent) -> str:
    """One line for an ``mcp/server`` record (``andon log``, and the run's own output)."""
    command = shlex.join(data.command)
    if data.state == "failed":
        return f"MCP server {data.name} ({command}) did not start: {data.reason or 'no reason'}"
    said = " ".join(p for p in (data.server_name, data.server_version) if p)
    who = f" ({said})" if said else ""
    offered = plural(len(data.tools), "tool")
    return f"MCP server {data.name}{who} started: {offered} offered ({command})"
