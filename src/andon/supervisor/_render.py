"""The text a model sees for a call's result: output head and tail, the status line and andon's
notes. Pure functions of what happened; the executor decides, these only say it."""

from __future__ import annotations

from andon.base import plural
from andon.protocol import Result
from andon.supervisor._outcome import format_output
from andon.supervisor._spill import Spill

__all__ = ["lost_content", "python_content", "shell_content"]


def shell_content(result: Result, spill: Spill, status: str) -> str:
    """Output (head, marker, tail), the status line, then what andon did or could not do."""
    parts = [
        format_output(result.output_head, result.output_tail, result.output_bytes, spill.relpath)
    ]
    if parts[0] and not parts[0].endswith("\n"):
        parts[0] += "\n"
    parts.append(status)
    if result.strays_killed:
        parts.append(
            f"\n[andon stopped {plural(result.strays_killed, 'background process')}"
            " this command left running]"
        )
    if spill.note():
        parts.append("\n" + spill.note())
    if result.unreachable:
        parts.append(
            f"\n[andon could not stop {plural(result.unreachable, 'process')} this command left "
            "running: containment mode 'pgroup' cannot reach processes that left the process "
            "group and their environment]"
        )
    return "".join(parts)


def python_content(text: str, *, stopped: bool, failed: bool, status: str) -> str:
    """The tool's own text; when it was stopped, an error line (unless the tool said one) and the
    status line, which names the cause once."""
    if not stopped:
        return text
    if failed and not text.startswith("Error:"):
        text = (f"{text}\n" if text else "") + "Error: tool call stopped"
    return f"{text}\n{status}"


def lost_content(spill: Spill, message: str) -> str:
    """What the call wrote before its worker was lost, and that it was."""
    output = format_output(spill.head(), b"", spill.total, spill.relpath)
    if output and not output.endswith("\n"):
        output += "\n"
    if spill.note():
        output += spill.note() + "\n"
    return output + f"Error: {message}"
