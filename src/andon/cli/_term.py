"""The human view of ``andon run`` and ``andon chat`` in a terminal (rich).

Two kinds of output over the same event stream:

* permanent lines, printed once: the assistant's text line by line (reasoning dimmed), each tool
  call (``▶``) and its result (``◀``, with the last lines of its output, the exit status or the
  ``[stopped …]`` marker and the duration), how each turn ended, stopping status lines, the summary;
* a live area, redrawn several times a second: the assistant's partial line, each running tool call
  with a spinner, its elapsed time and the tail of its output, and while a stop drains, what andon
  waits for ("stopping: SIGTERM sent to 1 process, SIGKILL in 1.6 s").

``andon run`` shows the live area with :class:`rich.live.Live`; ``andon chat`` shows it in the
prompt's bottom toolbar (prompt_toolkit owns the terminal there). Control sequences in tool output
(colours, cursor moves, titles, carriage-return progress bars) are stripped: a tool never drives
the user's terminal.

Like the other views, nothing here writes to the terminal on the event loop's thread: the
console writes into the view's writer thread (``andon.cli._writer.Writer``), one print as one
unit, so a terminal paused with Ctrl-S never stops signals or timers. While the terminal does not
keep up, the live area is not redrawn (its frames would only pile up); past the bound, whole prints
are dropped (the session log has every record).
"""

from __future__ import annotations

import asyncio
import collections
import io
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TextIO, assert_never, cast

from rich.console import Console, Group, RenderableType
from rich.text import Text

from andon.base import GracePolicy, plural
from andon.cli._output import (
    _STAGE_NAMES,
    HEAD_TOOLS,
    Output,
    describe_end,
    model_error,
    result_body,
    show_arguments,
    split_status,
    stream_texts,
    summary_text,
)
from andon.session import (
    AgentError,
    AgentEvent,
    AgentStatus,
    AssistantChunk,
    AssistantDelta,
    AssistantMessage,
    Completed,
    ContextCompacted,
    ContextTrimmed,
    EventData,
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
    SubagentEvent,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnAborted,
    TurnEnd,
    TurnStart,
    Unrecognized,
    UserMessageEntered,
)

__all__ = ["TermOutput", "strip_controls"]

_SPINNER: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_TAIL_LIVE: Final = 3  # output lines shown under a running call
_TAIL_DONE: Final = 8  # output lines kept when a call ends
# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, C1 CSI.
_CONTROL_SEQ: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_OTHER_CONTROLS: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def strip_controls(text: str) -> str:
    """``text`` without terminal control sequences; a carriage return keeps what follows it
    (the last state of a progress bar); tabs and newlines stay."""
    text = _CONTROL_SEQ.sub("", text).replace("\r\n", "\n")
    lines = [line.rsplit("\r", 1)[-1] for line in text.split("\n")]
    return _OTHER_CONTROLS.sub("", "\n".join(lines))


@dataclass
class _Call:
    call_id: str
    title: str
    started: float
    tool: str
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_TAIL_DONE)
    )
    pending: str = ""  # output not ending in a newline yet


@dataclass
class _Stop:
    """What the current stop waits for (the next stage and when it is due)."""

    text: str
    next_name: str | None = None
    due: float | None = None  # time.monotonic()


class _ConsoleFile:
    """What the rich console writes to: the view's writer, one print (a frame: permanent
    lines, the live area, cursor moves) as one unit, so no escape sequence is ever cut."""

    def __init__(self, out: TermOutput, stream: TextIO) -> None:
        self._output = out
        self._stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        self._output._emit(text, whole=True)
        return len(text)

    def flush(self) -> None:
        pass  # the writer thread writes as soon as it can

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self._stream.fileno()


class TermOutput(Output):
    """The rich view. ``console`` prints the permanent lines; :meth:`live` is the live area."""

    def __init__(
        self,
        grace: GracePolicy,
        stream: TextIO | None = None,
        *,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(grace, stream)
        if console is None:
            # Into our writer thread; a console given by the caller (andon chat, whose terminal
            # prompt_toolkit owns) is left as it is.
            file = cast(TextIO, _ConsoleFile(self, self._out))
            console = Console(file=file, highlight=False)
        self.console = console
        self._clock = clock
        self._calls: dict[str, _Call] = {}
        self._partial = ""  # the assistant's current line
        self._partial_kind = "text"
        self._stop: _Stop | None = None
        self._turn_started: float | None = None
        self.queued = 0  # follow-ups and steers waiting (chat folds the inbox splices)

    # -- permanent lines ------------------------------------------------------------------------

    def line(self, text: str | Text, style: str = "") -> None:
        self.console.print(text, style=style, soft_wrap=True, markup=False, emoji=False)

    def _flush_partial(self) -> None:
        if self._partial:
            self.line(self._partial, "dim" if self._partial_kind == "reasoning" else "")
            self._partial = ""

    def _stream(self, kind: str, text: str) -> None:
        if kind != self._partial_kind:
            self._flush_partial()
            self._partial_kind = kind
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.line(line, "dim" if kind == "reasoning" else "")

    def show(self, event: AgentEvent) -> None:
        match event:
            case Record(data=data):
                self._show_record(data)
            case ToolOutput(call_id=call_id, text=text):
                call = self._calls.get(call_id)
                if call is not None:
                    *lines, call.pending = (call.pending + strip_controls(text)).split("\n")
                    call.tail.extend(lines)
            case AgentError(code=code, message=message):
                self.line(f"error {code}: {message}", "bold red")
            case AgentStatus() | AssistantDelta() | SubagentEvent():
                pass  # the chunk records show the text; a subagent's events are not output
            case _:
                assert_never(event)

    def _show_record(self, data: EventData) -> None:
        now = self._clock()
        match data:
            case TurnStart():
                self._turn_started = now
            case AssistantChunk(deltas=deltas):
                for kind, text in stream_texts(deltas):
                    self._stream(kind, text)
            case AssistantMessage():
                self._flush_partial()
            case ToolCall(call_id=call_id, name=name, arguments=arguments):
                self._flush_partial()
                title = f"{name} {strip_controls(show_arguments(arguments))}"
                self._calls[call_id] = _Call(call_id, title, now, name)
                self.line(f"▶ {call_id} {title}", "cyan")
            case ToolResult():
                self._result(data)
            case TurnEnd(turn=turn, reason=reason):
                self._flush_partial()
                self._stop = None
                self._turn_started = None
                stopped = isinstance(reason, TurnAborted)
                failed = not isinstance(reason, Completed)
                style = "yellow" if stopped else ("red" if failed else "green")
                marker = " [stopped]" if stopped else ""
                self.line(f"■ turn {turn} ended{marker}: {describe_end(reason)}", style)
            case LlmRetry(error=error, delay=delay):
                self.line(
                    f"model request failed ({model_error(error)}); retrying in {delay:.1f} s",
                    "yellow",
                )
            case (
                SessionStart()
                | SessionResumed()
                | SessionRepaired()
                | InboxSpliced()
                | StepStart()
                | StepEnd()
                | UserMessageEntered()
                | LlmRequest()
                | ToolStarted()
                | ToolSignal()  # shown by feed (see _stopping_stage)
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
        call = self._calls.pop(call_id, None)
        lines, status = split_status(strip_controls(data.content))
        if call is not None and call.tool in HEAD_TOOLS:
            body = result_body(lines, call.tool, _TAIL_DONE)  # a file from its top
        elif call is not None:
            if call.pending:
                call.tail.append(call.pending)
            body = list(call.tail) or lines[-_TAIL_DONE:]
        else:
            body = lines[-_TAIL_DONE:]
        for line in body:
            self.line(Text.assemble(("  │ ", "dim"), line))
        if not status:
            status = f"[{data.error.code}]" if data.error else "[ok]"
        stopped = "stopped" in status
        style = "yellow" if stopped else ("green" if status in ("[ok]", "[exit code 0]") else "red")
        self.line(f"◀ {call_id} {status} in {data.duration:.2f} s", style)

    # -- stopping status ------------------------------------------------------------------------

    def stopping(self, signame: str, cause: str) -> None:
        """The first stop request: what andon now waits for."""
        calls = list(self.tracker.in_flight)
        g = self.grace
        if not calls:
            self._stop = _Stop(f"stopping ({signame}): closing the model request")
        else:
            self._stop = _Stop(
                f"stopping ({signame}): canceling {plural(len(calls), 'tool call')}",
                "SIGTERM" if g.interrupt else "SIGKILL",
                self._clock() + (g.term_after if g.interrupt else g.kill_at),
            )
        self.line(f"{self._stop.text}; press Ctrl-C again to kill now", "bold yellow")

    def forcing(self, signame: str) -> None:
        self.forced = True
        n = len(self.tracker.in_flight)
        self._stop = _Stop(f"{signame} again: killing {plural(n, 'tool process group')} now")
        self.line(self._stop.text, "bold red")

    def _stopping_stage(self, data: ToolSignal) -> None:
        stage = data.stage
        g = self.grace
        targets = plural(data.targets, "process")
        text = f"stopping: {_STAGE_NAMES[stage]} sent to {targets}"
        now = self._clock()
        after = ""
        if stage == "interrupt":
            self._stop = _Stop(text, "SIGTERM", now + g.term_after)
            after = f", SIGTERM in {g.term_after:g} s"
        elif stage == "term":
            self._stop = _Stop(text, "SIGKILL", now + g.kill_after)
            after = f", SIGKILL in {g.kill_after:g} s"
        else:
            self._stop = _Stop(text)
        if self.forced and after:
            # The force sends every stage left at once: no countdown runs.
            self._stop = _Stop(text)
            after = ", SIGKILL at once (forced)"
        self.line(f"{text}{after} ({data.call_id})", "yellow")

    # -- the live area --------------------------------------------------------------------------

    def live(self) -> RenderableType:
        """What is happening now (redrawn by rich Live or shown in the chat toolbar)."""
        return Group(*self.live_lines())

    def live_lines(self) -> list[Text]:
        now = self._clock()
        frame = _SPINNER[int(now * 10) % len(_SPINNER)]
        out: list[Text] = []
        if self._partial:
            out.append(
                Text(self._partial[-200:], "dim" if self._partial_kind == "reasoning" else "")
            )
        for call in self._calls.values():
            out.append(
                Text.assemble(
                    (f"{frame} ", "cyan"),
                    (f"{call.call_id} ", "bold"),
                    call.title[:80],
                    (f"  {now - call.started:.1f} s", "dim"),
                )
            )
            tail = [*call.tail, call.pending] if call.pending else list(call.tail)
            for line in tail[-_TAIL_LIVE:]:
                out.append(Text.assemble(("  │ ", "dim"), (line[:200], "dim")))
        if self._stop is not None:
            text = self._stop.text
            if self._stop.next_name and self._stop.due is not None:
                text += f", {self._stop.next_name} in {max(0.0, self._stop.due - now):.1f} s"
            out.append(Text(f"{frame} {text}", "bold yellow"))
        elif self._turn_started is not None and not self._calls:
            out.append(Text(f"{frame} working  {now - self._turn_started:.1f} s", "cyan"))
        return out

    def start_live(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.run_live())

    async def run_live(self, interval: float = 0.1) -> None:
        """Show :meth:`live` below the permanent lines until cancelled (``andon run``).

        Redrawn from the event loop (not rich's refresh thread), so the state is never read while
        an event changes it."""
        from rich.live import Live

        live = Live(
            get_renderable=self.live,
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        with self._forced():  # hiding the cursor is undone below, never dropped
            live.start()
        try:
            while True:
                writer = self._writer
                if writer is None or not writer.pending:  # a terminal that keeps up
                    live.refresh()
                await asyncio.sleep(interval)
        finally:
            with self._forced():  # the cursor comes back, whatever was dropped
                live.stop()

    def summary(self, summary: Mapping[str, Any]) -> None:
        if self.closed:
            return
        self._flush_partial()
        dropped = self.stdout_dropped
        note = f"; {plural(dropped, 'line')} dropped (stdout was not read)" if dropped else ""
        with self._forced():  # the last line is never dropped
            self.line(summary_text(summary, self.tracker.last_end) + note, "bold")
        self.finish(str(summary["session"]))


def to_ansi(lines: list[Text], width: int | None = None) -> str:
    """``lines`` as a string with ANSI styles (for prompt_toolkit's toolbar)."""
    width = width or shutil.get_terminal_size().columns
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width, highlight=False)
    for line in lines:
        line.truncate(width - 1)
        console.print(line, soft_wrap=False, no_wrap=True, overflow="crop")
    return buf.getvalue().rstrip("\n")
