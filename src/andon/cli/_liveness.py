"""Liveness lines for a log nobody watches live (docs/ci.md, Liveness in CI logs).

A CI job log that prints nothing for minutes cannot tell a long compile from a hang, and some CI
systems end a job that printed nothing for ten minutes. So, outside the terminal view (which has
spinners and clocks of its own), ``andon run`` says on stderr, every ``interval`` seconds:

* while the run starts (from its first line to the agent being ready for its first step), once it
  has taken ``min(5 s, interval)``: ``andon: still starting: 5s (waiting for …)``;
* for each tool call that printed nothing for ``interval``: ``andon: c1-2-1 still running: 2m30s,
  last output 45s ago`` (a chatty call gets no line: its output already shows it is alive).

These are live lines only: nothing here is written to the session log. Timers are
:meth:`Clock.call_at`, so tests drive them with a :class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, ClassVar, Final, Literal, TypeAlias

from andon.base import Clock, SystemClock, Timer, shape
from andon.session import (
    AgentEvent,
    LogValue,
    Record,
    SubagentEvent,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolStarted,
)

__all__ = ["STARTING_AFTER", "Liveness", "RunProgress", "StartProgress", "ToolProgress", "span"]

STARTING_AFTER: Final = 5.0
"""Seconds of start-up after which the first "still starting" line is said (or the interval, if
shorter)."""


def span(seconds: float) -> str:
    """A duration for people, to the second: ``45s``, ``2m30s``, ``1h05m``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True, slots=True)
class StartProgress(LogValue):
    """``run/progress`` while the run starts: for how long, and what it waits for."""

    elapsed: float
    waiting_for: Annotated[str | None, shape(omit=True)] = None
    phase: Literal["starting"] = "starting"
    json_tag: ClassVar = ("type", "run/progress")
    json_keys: ClassVar = ("type", "phase", "elapsed", "waiting_for")


@dataclass(frozen=True, slots=True)
class ToolProgress(LogValue):
    """``run/progress`` of a silent tool call: since when it runs (or waits for a ``worker``),
    and for how long it has been ``silent`` once it printed something."""

    call_id: str
    elapsed: float
    waiting: Annotated[Literal["worker"] | None, shape(omit=True)] = None
    silent: Annotated[float | None, shape(omit=True)] = None
    phase: Literal["tool"] = "tool"
    json_tag: ClassVar = ("type", "run/progress")
    json_keys: ClassVar = ("type", "phase", "call_id", "waiting", "elapsed", "silent")


RunProgress: TypeAlias = StartProgress | ToolProgress
"""A liveness line as a live event of ``andon run --json`` (docs/ci.md, Liveness in CI logs)."""


@dataclass
class _Call:
    seen: float  # when its tool/call came
    started: float | None = None  # when its tool/started came (a worker took it)
    last_output: float | None = None
    timer: Timer | None = None


class Liveness:
    """Says a line through ``emit`` while the run starts slowly or a tool call is silent.

    ``emit(text, event)`` gets the plain line (without the ``andon:`` prefix) and what it says as
    a live event (a :data:`RunProgress`) for views that want one. ``interval`` 0
    (or less) says nothing at all."""

    def __init__(
        self,
        interval: float,
        emit: Callable[[str, RunProgress], None],
        *,
        clock: Clock | None = None,
        waiting_for: str | None = None,
    ) -> None:
        self.interval = interval if math.isfinite(interval) and interval > 0 else 0.0
        self.clock = clock or SystemClock()
        self.waiting_for = waiting_for
        self._emit = emit
        self._calls: dict[str, _Call] = {}
        self._began: float | None = None
        self._starting: Timer | None = None
        self._closed = False

    @property
    def on(self) -> bool:
        return self.interval > 0 and not self._closed

    # -- start-up ---------------------------------------------------------------------------------

    def starting(self) -> None:
        """The run has begun: say so if it is still starting after ``min(5 s, interval)``."""
        if not self.on or self._began is not None:
            return
        self._began = self.clock.monotonic()
        first = min(STARTING_AFTER, self.interval)
        self._starting = self.clock.call_at(self._began + first, self._still_starting)

    def ready(self) -> None:
        """The agent is ready for its first step: no more start-up lines."""
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None

    def _still_starting(self) -> None:
        if not self.on or self._began is None:
            return
        now = self.clock.monotonic()
        elapsed = now - self._began
        what = f" (waiting for {self.waiting_for})" if self.waiting_for else ""
        event = StartProgress(elapsed, self.waiting_for or None)
        self._emit(f"still starting: {span(elapsed)}{what}", event)
        self._starting = self.clock.call_at(now + self.interval, self._still_starting)

    # -- tool calls -------------------------------------------------------------------------------

    def feed(self, event: AgentEvent) -> None:
        """Follow the tool calls of the event stream (``agent.events()``)."""
        if not self.on:
            return
        now = self.clock.monotonic()
        match event:
            case ToolOutput(call_id=call_id):
                call = self._calls.get(call_id)
                if call is not None:
                    call.last_output = now
            case SubagentEvent(call_id=call_id):
                # A subagent is a supervisor tool: no worker takes it and it writes no
                # tool/started, so its first event says it runs (since it was asked for). Its
                # events are not printed in the plain view: they are not output.
                call = self._calls.get(call_id)
                if call is not None and call.started is None:
                    call.started = call.seen
            case Record(data=ToolCall(call_id=call_id)):
                call = _Call(seen=now)
                self._calls[call_id] = call
                self._arm(call_id, call, now + self.interval)
            case Record(data=ToolStarted(call_id=call_id)):
                call = self._calls.get(call_id) or _Call(seen=now)
                self._calls[call_id] = call
                if call.started is None:
                    call.started = now
            case Record(data=ToolResult(call_id=call_id)):
                gone = self._calls.pop(call_id, None)
                if gone is not None and gone.timer is not None:
                    gone.timer.cancel()
            case _:
                pass  # nothing else says whether a call is alive

    def _arm(self, call_id: str, call: _Call, when: float) -> None:
        if call.timer is not None:
            call.timer.cancel()
        call.timer = self.clock.call_at(when, lambda: self._check(call_id))

    def _check(self, call_id: str) -> None:
        call = self._calls.get(call_id)
        if call is None or not self.on:
            return
        now = self.clock.monotonic()
        quiet_since = call.last_output
        if quiet_since is None:
            quiet_since = call.started if call.started is not None else call.seen
        if now - quiet_since < self.interval:
            # It spoke within the interval: look again an interval after its last word.
            self._arm(call_id, call, quiet_since + self.interval)
            return
        elapsed = now - (call.started if call.started is not None else call.seen)
        if call.started is None:
            event = ToolProgress(call_id, now - call.seen, waiting="worker")
            text = f"{call_id} still waiting for a tool worker: {span(now - call.seen)}"
        elif call.last_output is None:
            event = ToolProgress(call_id, elapsed)
            text = f"{call_id} still running: {span(elapsed)}, no output yet"
        else:
            silent = now - call.last_output
            event = ToolProgress(call_id, elapsed, silent=silent)
            text = f"{call_id} still running: {span(elapsed)}, last output {span(silent)} ago"
        self._emit(text, event)
        self._arm(call_id, call, now + self.interval)

    def close(self) -> None:
        """The run is over: cancel every timer; say nothing more."""
        self._closed = True
        self.ready()
        for call in self._calls.values():
            if call.timer is not None:
                call.timer.cancel()
        self._calls.clear()
