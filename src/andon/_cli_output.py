"""What ``andon run`` prints while the agent works.

Two renderers over the same event stream (``agent.events()``: log records plus live events):

* plain text (CI logs, and terminals for now): streamed assistant text on stdout, each tool call on
  one line, its live output indented under it, then its exit status; stopping status lines and
  errors on stderr;
* ``--json``: exactly one JSON object per line on stdout, nothing else there.

A closed stdout (``andon run --json | head -1``) raises :class:`StdoutClosed` once, after fd 1 was
pointed at ``/dev/null`` so that nothing later (the summary, interpreter shutdown) fails again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

from andon.base import GracePolicy

__all__ = ["JsonOutput", "Output", "StdoutClosed", "TextOutput", "Tracker", "say"]

_TAIL_LINES: Final = 8
_STAGE_NAMES: Final = {
    "interrupt": "SIGINT",
    "term": "SIGTERM",
    "kill": "SIGKILL",
    "sweep-term": "SIGTERM (leftovers)",
    "sweep-kill": "SIGKILL (leftovers)",
}


class StdoutClosed(Exception):
    """Whoever reads our stdout went away."""


def say(text: str) -> None:
    """One diagnostic line on stderr (never fails the run)."""
    with contextlib.suppress(OSError, ValueError):
        print(f"andon: {text}", file=sys.stderr, flush=True)


@dataclass
class Tracker:
    """What every renderer needs to know: calls in flight and how the last turn ended."""

    in_flight: dict[str, int | None] = field(default_factory=dict)  # call_id -> pgid
    last_end: dict[str, Any] | None = None
    turns: int = 0
    tool_calls: int = 0

    def feed(self, event: Mapping[str, Any]) -> None:
        data = event.get("data") or {}
        match event.get("type"):
            case "tool/call":
                self.tool_calls += 1
                self.in_flight[data["call_id"]] = None
            case "tool/started":
                self.in_flight[data["call_id"]] = data.get("pgid")
            case "tool/result":
                self.in_flight.pop(data.get("call_id", ""), None)
            case "turn/end":
                self.turns += 1
                self.last_end = data.get("reason")
            case _:
                pass


class Output:
    """Base renderer: writes to stdout, turns EPIPE into :class:`StdoutClosed`."""

    def __init__(self, grace: GracePolicy, stream: TextIO | None = None) -> None:
        self.grace = grace
        self.tracker = Tracker()
        self.closed = False
        self._out = stream or sys.stdout

    def write(self, text: str) -> None:
        if self.closed:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except (BrokenPipeError, ValueError):
            self.closed = True
            # Later writes (and the flush at interpreter exit) must not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._out.fileno())
            os.close(devnull)
            raise StdoutClosed() from None

    def feed(self, event: Mapping[str, Any]) -> None:
        self.tracker.feed(event)
        if event.get("type") == "tool/signal" and not self.closed:  # a closed stdout: quietly
            self._stopping_stage(event["data"])
        self.render(event)

    def render(self, event: Mapping[str, Any]) -> None:
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
            f"stopping ({signame}, cause {cause}): {first} {_plural(len(calls), 'tool call')} "
            f"({', '.join(calls)}); {nxt}. Again to kill now"
        )

    def forcing(self, signame: str) -> None:
        n = len(self.tracker.in_flight)
        say(f"{signame} again: killing {_plural(n, 'tool process group')} now")

    def _stopping_stage(self, data: Mapping[str, Any]) -> None:
        # ``at`` counts from the call's start, not the stop's: name the next stage by its delay.
        stage = str(data.get("stage"))
        g = self.grace
        waiting = ""
        if stage in ("interrupt", "timeout-interrupt"):
            waiting = f"; SIGTERM in {g.term_after:g} s unless it exits"
        elif stage in ("term", "timeout-term"):
            waiting = f"; SIGKILL in {g.kill_after:g} s unless it exits"
        elif stage in ("kill", "sweep-kill"):
            waiting = "; waiting for the kernel to reap them"
        say(
            f"stopping: {_STAGE_NAMES.get(stage, stage)} sent to "
            f"{_plural(int(data.get('targets') or 0), 'process')} of {data.get('call_id')}{waiting}"
        )


class JsonOutput(Output):
    def render(self, event: Mapping[str, Any]) -> None:
        self.write(json.dumps(event, ensure_ascii=False) + "\n")

    def summary(self, summary: Mapping[str, Any]) -> None:
        self.write(json.dumps({"type": "run/summary", **summary}, ensure_ascii=False) + "\n")


class TextOutput(Output):
    def __init__(self, grace: GracePolicy, stream: TextIO | None = None) -> None:
        super().__init__(grace, stream)
        self._mid_line = False  # streamed assistant text without its newline yet
        self._saw_output: set[str] = set()
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

    def render(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        data: Mapping[str, Any] = event.get("data") or {}
        match kind:
            case "assistant/chunk":
                for delta in data.get("deltas", ()):
                    text = str(delta.get("text", ""))
                    if not text:
                        continue
                    if delta.get("type") == "text":
                        self.write(text)
                    elif delta.get("type") == "reasoning" and self._tty:
                        self.write(f"\x1b[2m{text}\x1b[0m")  # dimmed; CI logs leave it out
                    else:
                        continue
                    self._mid_line = not text.endswith("\n")
            case "assistant/message":
                if self._mid_line:
                    self.write("\n")
                    self._mid_line = False
            case "tool/call":
                self._line(f"▶ {data.get('call_id')} {data.get('name')} {_args(data)}")
            case "tool/output":
                call_id = str(event.get("call_id"))
                self._saw_output.add(call_id)
                text = self._pending + str(event.get("text", ""))
                *lines, self._pending = text.split("\n")
                for line in lines:
                    self._line(f"  │ {line}")
            case "tool/result":
                self._result(data)
            case "turn/end":
                self._line(f"■ turn {data.get('turn')} ended: {_reason(data.get('reason'))}")
            case "agent/error":
                error = event.get("error") or {}
                say(f"error {error.get('code')}: {error.get('message')}")
            case "llm/retry":
                error = data.get("error") or {}
                say(
                    f"model request failed ({error.get('code')}: {error.get('message')}); "
                    f"retrying in {float(data.get('delay') or 0):.1f} s"
                )
            case _:
                pass

    def _result(self, data: Mapping[str, Any]) -> None:
        call_id = str(data.get("call_id"))
        content = str(data.get("content", ""))
        lines = content.rstrip("\n").split("\n")
        # The status lines andon appends (`[exit code 2]`, `[stopped: …]`, `[andon stopped …]`).
        n = 0
        while n < len(lines) and lines[-1 - n].startswith("[") and lines[-1 - n].endswith("]"):
            n += 1
        status = " ".join(lines[len(lines) - n :])
        body = lines[: len(lines) - n]
        if self._pending:
            self._line(f"  │ {self._pending}")
            self._pending = ""
        if call_id not in self._saw_output:
            for line in body[-_TAIL_LINES:]:
                self._line(f"  │ {line}")
        error = data.get("error") or {}
        if not status:
            status = f"[{error.get('code')}]" if error else "[ok]"
        duration = data.get("duration")
        took = f" in {float(duration):.2f} s" if isinstance(duration, int | float) else ""
        self._line(f"◀ {call_id} {status}{took}")

    def summary(self, summary: Mapping[str, Any]) -> None:
        if self.closed:
            return  # whoever read us went away: dispose quietly
        say(
            f"{_plural(int(summary['turns']), 'turn')}, "
            f"{_plural(int(summary['tool_calls']), 'tool call')}, "
            f"{summary['duration']:.1f} s, ended {_reason(summary['ended'])}, "
            f"exit {summary['exit_code']}; session {summary['session']}"
        )


def _args(data: Mapping[str, Any]) -> str:
    raw = str(data.get("arguments", ""))
    try:
        args = json.loads(raw)
    except ValueError:
        args = None
    if isinstance(args, dict) and isinstance(args.get("command"), str):
        text = "$ " + str(args["command"]).strip().replace("\n", " ⏎ ")
    else:
        text = raw
    return text if len(text) <= 160 else text[:157] + "..."


def _reason(reason: Any) -> str:
    if not isinstance(reason, Mapping):
        return "(no turn ran)"
    kind = reason.get("kind")
    if kind == "aborted":
        cause = reason.get("reason") or {}
        extra = f": {cause['reason']}" if cause.get("reason") else ""
        return f"aborted ({cause.get('kind')}{extra})"
    if kind == "error":
        error = reason.get("error") or {}
        return f"error ({error.get('code')}: {error.get('message')})"
    if kind == "blocked":
        return f"blocked by {reason.get('by')}"
    return str(kind)


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"
