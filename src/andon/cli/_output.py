"""What ``andon run`` prints while the agent works.

Two views of the same event stream (``agent.events()``: log records plus live events, typed as
:data:`~andon.session.AgentEvent`; the terminal's is ``andon.cli._term``), each a subclass of
:class:`Output` whose :meth:`~Output.show` matches on the event classes:

* plain text (CI logs and pipes; a terminal gets ``andon.cli._term``'s view): streamed assistant
  text on stdout, each tool call on one line, its live output indented under it, then its exit
  status; stopping status lines and errors on stderr;
* ``--json``: exactly one JSON object per line on stdout, nothing else there.

Nothing here writes to a pipe on the event loop's thread: stdout goes through a bounded buffer
to a writer thread (``andon.cli._writer``), and so do diagnostics on stderr when fd 2 is a pipe or
a terminal. A reader that stops reading (``| less``, Ctrl-S, a back-pressuring log shipper)
therefore never stops signals, tool timeouts or the grace timeline; past the bound whole stdout
lines are dropped (the session log has every record), said once on stderr and counted in the
summary (``stdout_dropped``, only when not zero). The summary waits for stdout to be read, with a
bound.

A closed stdout (``andon run --json | head -1``) raises :class:`StdoutClosed` once, from the next
write after the writer thread saw EPIPE; the thread has pointed fd 1 at ``/dev/null`` so that
nothing later (the summary, interpreter shutdown) fails again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TextIO, assert_never

from andon.base import GracePolicy, Hook, SignalStage, plural
from andon.cli._liveness import Liveness, RunProgress, ToolProgress
from andon.cli._writer import Writer, can_stall, settle_others, stderr_writer
from andon.session import (
    AgentError,
    AgentEvent,
    AgentStatus,
    AssistantChunk,
    AssistantDelta,
    AssistantMessage,
    Blocked,
    Completed,
    ContextCompacted,
    ContextTrimmed,
    EventData,
    InboxSpliced,
    Interrupted,
    LlmRequest,
    LlmRetry,
    MaxTokens,
    McpServerEvent,
    Record,
    SessionRepaired,
    SessionResumed,
    SessionStart,
    StepEnd,
    StepStart,
    SubagentEvent,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnAborted,
    TurnEnd,
    TurnEndReason,
    TurnFailed,
    TurnStart,
    Unrecognized,
    UserMessageEntered,
)

__all__ = [
    "HEAD_TOOLS",
    "JsonOutput",
    "Output",
    "SayHandler",
    "StdoutClosed",
    "TextOutput",
    "Tracker",
    "describe_end",
    "install_log_handler",
    "result_body",
    "say",
    "summary_text",
]

_TAIL_LINES: Final = 8
_STAGE_NAMES: Final[Mapping[SignalStage, str]] = {
    "interrupt": "SIGINT",
    "term": "SIGTERM",
    "kill": "SIGKILL",
    "sweep-term": "SIGTERM (leftovers)",
    "sweep-kill": "SIGKILL (leftovers)",
}


class StdoutClosed(Exception):
    """Whoever reads our stdout went away."""


# How long a diagnostic waits to be written (and for the stdout lines before it): long enough for
# any reader that reads, short enough that a stalled one costs the loop nothing that matters (and
# only once per stall, see Writer.settle).
_SAY_WAIT: Final = 0.05
# At exit, the summary waits for stdout while its reader takes something at least every
# _EXIT_STALL seconds, and never longer than _EXIT_CAP in all.
_EXIT_QUICK: Final = 0.5
_EXIT_STALL: Final = 5.0
_EXIT_CAP: Final = 30.0


class SayHandler(logging.Handler):
    """Log records of andon's own loggers as diagnostic lines: the ``andon:`` prefix, and the
    same never-blocking path as :func:`say` (a stalled stderr must not freeze the loop)."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            say(self.format(record))


def install_log_handler() -> None:
    """Route the ``andon`` loggers (warnings and worse) through :class:`SayHandler`; without it
    Python's last-resort handler prints them bare, without the prefix."""
    logger = logging.getLogger("andon")
    if not any(isinstance(h, SayHandler) for h in logger.handlers):
        logger.addHandler(SayHandler(logging.WARNING))
        logger.propagate = False


def say(text: str) -> None:
    """One diagnostic line on stderr (never fails the run, never blocks on a stalled reader)."""
    line = f"andon: {text}\n"
    # An in-process replacement of sys.stderr (a capture) or a regular file cannot stall.
    writer = stderr_writer() if sys.stderr is sys.__stderr__ else None
    if writer is None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line)
            sys.stderr.flush()
        return
    # After the stdout lines it comments on (`2>&1` into one CI log), and out before we go on:
    # hard_exit says its line and then calls os._exit.
    settle_others(writer, _SAY_WAIT)
    writer.settle(writer.write(line), _SAY_WAIT)


@dataclass
class Tracker:
    """What every view needs to know: calls in flight and how the last turn ended (and, for the
    summary, what the model said last)."""

    in_flight: dict[str, int | None] = field(default_factory=dict)  # call_id -> pgid
    last_end: TurnEndReason | None = None
    turns: int = 0
    tool_calls: int = 0
    final_text: str | None = None  # the text blocks of the last assistant/message, joined

    def feed(self, event: AgentEvent) -> None:
        if not isinstance(event, Record):
            return  # only records change what is tracked
        match event.data:
            case ToolCall(call_id=call_id):
                self.tool_calls += 1
                self.in_flight[call_id] = None
            case ToolStarted(call_id=call_id, pgid=pgid):
                self.in_flight[call_id] = pgid
            case ToolResult(call_id=call_id):
                self.in_flight.pop(call_id, None)
            case TurnEnd(reason=reason):
                self.turns += 1
                self.last_end = reason
            case AssistantMessage(message=message):
                self.final_text = message.text
            case _:
                pass  # the views match every class; the tracker only these


class Output:
    """Base view: shows each event (:meth:`show`), writes to stdout through a writer thread, turns
    EPIPE into :class:`StdoutClosed`."""

    def __init__(self, grace: GracePolicy, stream: TextIO | None = None) -> None:
        self.grace = grace
        self.tracker = Tracker()
        self._closed = False
        self._out = stream or sys.stdout
        self._writer: Writer | None = None  # started by the first write
        self._direct = False  # an in-memory stream: written here, it cannot stall
        self._force = False  # writes that must not be dropped (see _forced)
        self._told_drop = False
        # A second signal forced the stop: every stage left is sent at once (the grace ladder's
        # Force), so a stage line must not announce a countdown that will not run.
        self.forced = False
        self._closed_callbacks: list[Callable[[], None]] = []
        # Lines while the run starts slowly or a tool is silent (docs/ci.md, Liveness in CI
        # logs); None in the terminal view, which has clocks of its own.
        self.liveness: Liveness | None = None

    def start_live(self) -> asyncio.Task[None] | None:
        """Start redrawing a live area on the running loop, where the view has one (the
        terminal's: spinners, tails, stopping status); a plain or ``--json`` view has none. A
        method of the view, so that only a terminal's run imports rich (andon.cli._term)."""
        return None

    def watch(self, interval: float) -> Liveness:
        """Say liveness lines every ``interval`` seconds (0: never) through :meth:`progress`."""
        self.liveness = Liveness(interval, self.progress)
        return self.liveness

    def progress(self, text: str, event: RunProgress) -> None:
        """A liveness line: on stderr, where a person reading the job log sees it (with
        ``--json > file`` too). Never raises: it is called from a timer."""
        if not self.closed:
            say(text)

    @property
    def closed(self) -> bool:
        """Whoever read our stdout went away (seen by a write here or by the writer thread)."""
        return self._closed or (self._writer is not None and self._writer.broken)

    @property
    def stdout_dropped(self) -> int:
        """stdout lines dropped because the reader did not keep up."""
        return self._writer.dropped if self._writer is not None else 0

    def on_closed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the running event loop as soon as the writer thread sees that the
        reader went away, rather than at the next write (which raises :class:`StdoutClosed`)."""
        loop = asyncio.get_running_loop()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
                loop.call_soon_threadsafe(callback)

        self._closed_callbacks.append(notify)
        if self._writer is not None:
            self._writer.on_broken(notify)

    def write(self, text: str) -> None:
        """Queue ``text`` for stdout; never blocks. Raises :class:`StdoutClosed` once."""
        if self._closed:
            return
        self._raise_if_closed()
        self._emit(text, whole=False)

    def _emit(self, text: str, *, whole: bool) -> None:
        """``text`` to stdout, kept or dropped line by line (``whole``: as one unit). Never raises
        :class:`StdoutClosed` (the rich console calls this from inside its own print)."""
        if self._closed:
            return
        writer = self._sink()
        if writer is None:
            try:
                self._out.write(text)
                self._out.flush()
            except (BrokenPipeError, ValueError):
                self._closed = True
            return
        writer.write(text, whole=whole, force=self._force)
        if writer.dropped and not self._told_drop:
            self._told_drop = True
            say(
                "stdout is not being read: dropping whole lines while more than "
                f"{writer.limit >> 10} KiB wait to be written (the session log has every record)"
            )

    def _sink(self) -> Writer | None:
        if self._writer is None and not self._direct:
            try:
                fd = self._out.fileno()
                self._out.flush()  # what was printed through the stream itself goes first
            except (OSError, ValueError, AttributeError):
                fd = -1
            if not can_stall(fd):  # in memory, or a regular file (`> andon.jsonl`): no reader
                self._direct = True
                return None
            encoding = getattr(self._out, "encoding", None) or "utf-8"
            self._writer = Writer(fd, encoding=encoding)
            for notify in self._closed_callbacks:
                self._writer.on_broken(notify)
        return self._writer

    def _raise_if_closed(self) -> None:
        writer = self._writer
        if self._closed or writer is None:
            return
        if writer.broken:
            self._closed = True
            raise StdoutClosed()
        if writer.error is not None:
            self._closed = True
            raise writer.error  # as a write on this thread would have (ENOSPC, EIO)

    @contextlib.contextmanager
    def _forced(self) -> Iterator[None]:
        """Writes inside are kept past the bound (the summary, restoring the terminal's cursor)."""
        self._force = True
        try:
            yield
        finally:
            self._force = False

    def finish(self, session: str | None = None) -> None:
        """Wait (bounded) for stdout to take what is queued; say on stderr what was dropped and
        whether stdout is still stalled. Called by :meth:`summary`; never hangs."""
        writer = self._writer
        if writer is None or self.closed:
            return
        if writer.dropped:
            where = f" (andon log {session})" if session else ""
            say(
                f"{plural(writer.dropped, 'stdout line')} dropped while stdout was not being "
                f"read; the session log has every record{where}"
            )
        if writer.drain(_EXIT_QUICK, _EXIT_QUICK):
            return
        say(
            f"stdout is not being read: waiting for it to take the last "
            f"{_kib(writer.pending)} (up to {_EXIT_CAP:g} s, {_EXIT_STALL:g} s without progress)"
        )
        if not writer.drain(_EXIT_STALL, _EXIT_CAP) and not self.closed:
            say(
                f"stdout is still not being read: exiting without its last "
                f"{_kib(writer.pending)} (the session log has every record)"
            )

    def feed(self, event: AgentEvent) -> None:
        """Track ``event``, then :meth:`show` it."""
        self.tracker.feed(event)
        if self.liveness is not None:
            self.liveness.feed(event)
        self._raise_if_closed()
        if isinstance(event, Record) and isinstance(event.data, ToolSignal) and not self.closed:
            self._stopping_stage(event.data)  # a closed stdout: quietly
        self.show(event)

    def show(self, event: AgentEvent) -> None:
        """Show one event the way this view does."""
        raise NotImplementedError

    def summary(self, summary: Mapping[str, Any]) -> None:
        raise NotImplementedError

    # -- stopping status lines (stderr in both modes) -------------------------------------------

    def stopping(self, signame: str, cause: str) -> None:
        """The status line of the first stop request: what andon now waits for."""
        calls = [c for c in self.tracker.in_flight]
        if not calls:
            say(
                f"stopping ({signame}, cause {cause}): closing the model request "
                "(no tool is running)"
            )
            return
        g = self.grace
        first = "SIGINT to" if g.interrupt else "a cooperative stop of"
        nxt = f"SIGTERM in {g.term_after:g} s, SIGKILL in {g.kill_at:g} s"
        say(
            f"stopping ({signame}, cause {cause}): {first} {plural(len(calls), 'tool call')} "
            f"({', '.join(calls)}); {nxt}. Again to kill now"
        )

    def forcing(self, signame: str) -> None:
        self.forced = True
        n = len(self.tracker.in_flight)
        say(f"{signame} again: killing {plural(n, 'tool process group')} now")

    def _stopping_stage(self, data: ToolSignal) -> None:
        # ``at`` counts from the call's start, not the stop's: name the next stage by its delay.
        stage = data.stage
        g = self.grace
        waiting = ""
        if stage == "interrupt":
            waiting = f"; SIGTERM in {g.term_after:g} s unless it exits"
        elif stage == "term":
            waiting = f"; SIGKILL in {g.kill_after:g} s unless it exits"
        elif stage in ("kill", "sweep-kill"):
            waiting = "; waiting for the kernel to reap them"
        if self.forced and waiting.startswith("; SIG"):
            # The force sends every stage left at once: no countdown runs.
            waiting = "; SIGKILL at once (forced)"
        say(
            f"stopping: {_STAGE_NAMES[stage]} sent to "
            f"{plural(data.targets, 'process')} of {data.call_id}{waiting}"
        )


class JsonOutput(Output):
    """``--json``: each event as the JSON object of its class's codec (a record exactly as its
    log line, docs/log-format.md, Records), one a line."""

    def show(self, event: AgentEvent) -> None:
        self.write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")

    def progress(self, text: str, event: RunProgress) -> None:
        """The line on stderr, and for a silent tool call a live ``run/progress`` event on stdout
        for a program (or a job log) that reads it: never a log record. Start-up is said on
        stderr only: the first line on stdout is the session's first record, always."""
        super().progress(text, event)
        if not isinstance(event, ToolProgress):
            return
        # Through the codec, its seconds to the millisecond.
        line = {k: round(v, 3) if isinstance(v, float) else v for k, v in event.to_json().items()}
        # _emit, not write: a closed stdout or a write error is left for the next event's write
        # to raise, on the view's task rather than in a timer.
        self._emit(json.dumps(line, ensure_ascii=False) + "\n", whole=False)

    def summary(self, summary: Mapping[str, Any]) -> None:
        line: dict[str, Any] = {"type": "run/summary", **summary}
        if self.stdout_dropped:  # only when not zero: a run that was read in full looks as before
            line["stdout_dropped"] = self.stdout_dropped
        with self._forced():  # the last line is never dropped
            self.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.finish(str(summary.get("session", "")) or None)


class TextOutput(Output):
    def __init__(self, grace: GracePolicy, stream: TextIO | None = None) -> None:
        super().__init__(grace, stream)
        self._mid_line = False  # streamed assistant text without its newline yet
        self._saw_output: set[str] = set()
        self._tools: dict[str, str] = {}  # call_id -> the tool's name, until its result
        self._pending = ""  # tool output not yet ending in a newline
        try:
            self._tty = self._out.isatty()
        except (OSError, ValueError):
            self._tty = False

    def _line(self, text: str) -> None:
        if self._mid_line:
            self.write("\n")
            self._mid_line = False
        self.write(text + "\n")

    def show(self, event: AgentEvent) -> None:
        match event:
            case Record(data=data):
                self._show_record(data)
            case ToolOutput(call_id=call_id, text=text):
                self._saw_output.add(call_id)
                *lines, self._pending = (self._pending + text).split("\n")
                for line in lines:
                    self._line(f"  │ {line}")
            case AgentError(code=code, message=message):
                say(f"error {code}: {message}")
            case AgentStatus() | AssistantDelta() | SubagentEvent():
                pass  # the chunk records show the text; a subagent's events are not output
            case _:
                assert_never(event)

    def _show_record(self, data: EventData) -> None:
        match data:
            case AssistantChunk(deltas=deltas):
                for kind, text in stream_texts(deltas):
                    if kind == "text":
                        self.write(text)
                    elif self._tty:
                        self.write(
                            f"\x1b[2m{text}\x1b[0m"
                        )  # dimmed reasoning; CI logs leave it out
                    else:
                        continue
                    self._mid_line = not text.endswith("\n")
            case AssistantMessage():
                if self._mid_line:
                    self.write("\n")
                    self._mid_line = False
            case ToolCall(call_id=call_id, name=name, arguments=arguments):
                self._tools[call_id] = name
                self._line(f"▶ {call_id} {name} {show_arguments(arguments)}")
            case ToolResult():
                self._result(data)
            case TurnEnd(turn=turn, reason=reason):
                self._line(f"■ turn {turn} ended: {describe_end(reason)}")
            case LlmRetry(error=error, delay=delay):
                say(f"model request failed ({model_error(error)}); retrying in {delay:.1f} s")
            case (
                SessionStart()
                | SessionResumed()
                | SessionRepaired()
                | InboxSpliced()
                | TurnStart()
                | StepStart()
                | StepEnd()
                | UserMessageEntered()
                | LlmRequest()
                | ToolStarted()
                | ToolSignal()  # said on stderr by feed
                | ContextTrimmed()
                | ContextCompacted()
                | McpServerEvent()  # the warning of a server that did not start is on stderr
                | Unrecognized()
            ):
                pass
            case _:
                assert_never(data)

    def _result(self, data: ToolResult) -> None:
        call_id = data.call_id
        body, status = split_status(data.content)
        if self._pending:
            self._line(f"  │ {self._pending}")
            self._pending = ""
        tool = self._tools.pop(call_id, None)
        if call_id not in self._saw_output:
            for line in result_body(body, tool, _TAIL_LINES):
                self._line(f"  │ {line}")
        if not status:
            status = f"[{data.error.code}]" if data.error else "[ok]"
        self._line(f"◀ {call_id} {status} in {data.duration:.2f} s")

    def summary(self, summary: Mapping[str, Any]) -> None:
        if self.closed:
            return  # whoever read us went away: dispose quietly
        self.finish(str(summary["session"]))
        say(summary_text(summary, self.tracker.last_end))


def summary_text(summary: Mapping[str, Any], ended: TurnEndReason | None) -> str:
    """The one-line summary a person reads (the plain view's stderr, the terminal view's last
    line): turns, tool calls, duration, cost when known, how the last turn ``ended``, the exit
    code, the session."""
    cost = summary.get("cost")
    spent = f"{_usd(float(cost['usd']))}, " if isinstance(cost, Mapping) else ""
    return (
        f"{plural(int(summary['turns']), 'turn')}, "
        f"{plural(int(summary['tool_calls']), 'tool call')}, "
        f"{float(summary['duration']):.1f} s, {spent}ended {describe_end(ended)}, "
        f"exit {summary['exit_code']}; session {summary['session']}"
    )


def _usd(amount: float) -> str:
    """A cost for people: ``$0.0123``; a smaller one keeps its digits (``$0.000042``)."""
    return f"${amount:.4f}" if amount >= 0.001 or amount == 0 else f"${amount:.6f}"


def show_arguments(raw: str) -> str:
    """A tool call's arguments on one line: ``$ make -j2`` for a command, else the JSON text,
    cut at 160 characters."""
    try:
        args = json.loads(raw)
    except ValueError:
        args = None
    command = args.get("command") if isinstance(args, dict) else None
    text = "$ " + command.strip().replace("\n", " ⏎ ") if isinstance(command, str) else raw
    return text if len(text) <= 160 else text[:157] + "..."


def describe_end(reason: TurnEndReason | None) -> str:
    """How a turn ended, in the CLI's words (``aborted (hook: too slow)``); ``None``: no turn
    ran."""
    match reason:
        case None:
            return "(no turn ran)"
        case TurnAborted(cause=cause):
            extra = f": {cause.reason}" if isinstance(cause, Hook) and cause.reason else ""
            return f"aborted ({cause.kind}{extra})"
        case TurnFailed(code=code, message=message):
            return f"error ({code}: {message})"
        case Blocked(by=by):
            return f"blocked by {by}"
        case Completed() | MaxTokens() | Interrupted():
            return reason.kind
        case _:
            assert_never(reason)


def stream_texts(
    deltas: Iterable[Mapping[str, Any]],
) -> Iterator[tuple[Literal["text", "reasoning"], str]]:
    """The visible pieces of an ``assistant/chunk``'s deltas: each text or reasoning delta's
    kind and text (a tool call's argument fragments are not shown as they stream). The deltas
    are JSON the record keeps as it is (docs/log-format.md, Streamed deltas): read here once."""
    for delta in deltas:
        kind, text = delta.get("type"), delta.get("text")
        if (kind == "text" or kind == "reasoning") and isinstance(text, str) and text:
            yield kind, text


def model_error(error: Mapping[str, Any]) -> str:
    """``code: message`` of a model error as ``llm/retry`` records it (a JSON object)."""
    return f"{error.get('code')}: {error.get('message')}"


HEAD_TOOLS: Final = frozenset({"read_file"})
"""Tools whose result is shown from its first lines: a file read is read from its top, and its
last lines alone look as if the model read half the file. A command's output keeps its tail
(where the error and the summary are)."""


def result_body(lines: list[str], tool: str | None, keep: int) -> list[str]:
    """The lines of a tool result a view shows: the first ``keep`` of a file read, with a note
    of how many more the model got; the last ``keep`` of anything else."""
    if tool not in HEAD_TOOLS:
        return lines[-keep:]
    if len(lines) <= keep:
        return lines
    return [*lines[:keep], f"… {plural(len(lines) - keep, 'more line')}"]


def split_status(content: str) -> tuple[list[str], str]:
    """A tool result's content as its output lines and the status lines andon appends at its end
    (``[exit code 2]``, ``[stopped: …]``, ``[andon stopped …]``), joined by spaces."""
    lines = content.rstrip("\n").split("\n")
    n = 0
    while n < len(lines) and lines[-1 - n].startswith("[") and lines[-1 - n].endswith("]"):
        n += 1
    return lines[: len(lines) - n], " ".join(lines[len(lines) - n :])


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"
