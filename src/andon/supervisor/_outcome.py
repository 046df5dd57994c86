"""What a tool call came to: the ``tool/result`` fields, and the text the model sees.

``content`` for a shell tool is the output (head and tail when long; the full copy is the spill
file) followed by exactly one status line: ``[exit code 2]``, ``[stopped: …]`` or
``[timed out after 120s; …]``, plus a line when strays were stopped or could not be reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, final

from andon.base import Cause, EndedBy, ErrorCode, StageMark, clean_text, show_name
from andon.protocol import ErrorInfo, Started

__all__ = ["StageMark", "ToolOutcome", "format_output", "not_run", "status_line"]

_SIGNAL_NAMES = {2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM", 1: "SIGHUP", 6: "SIGABRT", 11: "SIGSEGV"}
_STAGE_SIGNAL = {"interrupt": "SIGINT", "term": "SIGTERM", "kill": "SIGKILL"}


@final
@dataclass(frozen=True)
class ToolOutcome:
    """One tool call's result: everything ``tool/result`` records, turn and step aside."""

    call_id: str
    content: str
    is_error: bool
    ended_by: EndedBy
    duration: float
    error: ErrorInfo | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    ran: bool = False  # an exit status exists (the tool's process ran and ended)
    strays_killed: int = 0
    unreachable: int = 0  # reported in content only: the log has no field for it
    output_bytes: int = 0
    output_file: str | None = None
    started: Started | None = None
    stages: tuple[StageMark, ...] = field(default=())

    def record_data(self) -> dict[str, Any]:
        """The ``tool/result`` data (docs/log-format.md, Tool calls; without ``turn`` and
        ``step``)."""
        data: dict[str, Any] = {
            "call_id": self.call_id,
            "content": self.content,
            "is_error": self.is_error,
        }
        if self.error is not None:
            data["error"] = {
                "name": self.error.name,
                "code": str(self.error.code),
                "message": self.error.message,
            }
        if self.ran:
            data["exit"] = {"code": self.exit_code, "signal": self.exit_signal}
        data["ended_by"] = self.ended_by
        if self.strays_killed:
            data["strays_killed"] = self.strays_killed
        data["output_bytes"] = self.output_bytes
        if self.output_file is not None:
            data["output_file"] = self.output_file
        data["duration"] = round(self.duration, 6)
        return data

    @property
    def code(self) -> ErrorCode | None:
        return self.error.code if self.error is not None else None


def not_run(call_id: str, code: ErrorCode, name: str, message: str) -> ToolOutcome:
    """The result of a call that never ran (skipped, denied, invalid, unknown, ...)."""
    return ToolOutcome(
        call_id=call_id,
        content=f"Error: {message}",
        is_error=True,
        ended_by="not-run",
        duration=0.0,
        error=ErrorInfo(name=name, code=code, message=message),
    )


def format_output(head: bytes, tail: bytes, total: int, spill: str | None) -> str:
    """Head and tail of the output as text; a marker in the middle says what was left out."""
    shown = len(head) + len(tail)
    text = clean_text(head)
    if total > shown:
        where = f"; full output in {show_name(spill)}" if spill else ""
        text += f"\n[… {total - shown} bytes omitted{where} …]\n"
    text += clean_text(tail)
    return text


def _seconds(value: float) -> str:
    return f"{value:g}s" if value == int(value) else f"{value:.2f}s"


def _describe_cause(cause: Cause | None) -> str:
    if cause is None:
        return "aborted"
    described = cause.describe()
    return f"aborted {described}" if described.startswith("by ") else f"aborted ({described})"


def status_line(
    *,
    reason: str | None,  # None: ended on its own; "abort", "timeout" or "internal"
    cause: Cause | None,
    timeout: float | None,
    stages: tuple[StageMark, ...],
    exit_code: int | None,
    exit_signal: int | None,
    since_stop: float | None,
    python: bool = False,
) -> str:
    if reason is None:
        if exit_signal is not None:
            name = _SIGNAL_NAMES.get(exit_signal, f"signal {exit_signal}")
            return f"[terminated by {name}]"
        return f"[exit code {exit_code}]"
    if reason == "timeout" and timeout is not None and math.isfinite(timeout):
        head = f"timed out after {_seconds(timeout)}"
    elif reason == "internal":
        head = "after an internal error in andon"
    else:
        head = _describe_cause(cause)
    parts = [head]
    marks = []
    for mark in stages:
        name = "signal" if python and mark.stage == "interrupt" else _STAGE_SIGNAL[mark.stage]
        marks.append(f"{name} at +{mark.since_stop:.2f}s")
    if marks:
        parts.append(", ".join(marks))
    after = f" after {since_stop:.2f}s" if since_stop is not None else ""
    if exit_signal is not None:
        parts.append(f"exited with signal {exit_signal}{after}")
    elif exit_code is not None:
        parts.append(f"exited with code {exit_code}{after}")
    elif python:
        parts.append(f"stopped{after}")
    return f"[{'stopped: ' if reason != 'timeout' else ''}{'; '.join(parts)}]"
