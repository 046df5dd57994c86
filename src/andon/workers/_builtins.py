"""The built-in tools (docs/workers.md, Tools).

``bash`` is a shell tool: the worker runs it in its own process group. The file tools are Python
tools that run in the call's own call process, whose working directory is the session's for the
call, so relative paths resolve against it. A tool that fails raises; the call process turns the
exception into a ``TOOL_ERROR`` result carrying its type and text.

File names may be any bytes. The file tools show a name with :func:`~andon.base.show_name` (a byte
that is not valid UTF-8 is ``\\xHH``, a backslash ``\\\\``) and read every path they are given with
:func:`~andon.base.name_path`, so the model can name back what ``list_files`` or ``grep`` showed
(docs/workers.md, Tools).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from andon.base import clean_text, name_path, show_name
from andon.workers._registry import Tool, ToolRegistry, schema_from_signature, tool

__all__ = ["BASH", "default", "edit_file", "grep", "list_files", "read_file", "write_file"]

# bash's own limits, used when the agent sets none. An agent's ``tool_timeout``
# (``--tool-timeout``) replaces the default and raises the cap to at least itself; the executor
# combines them (``ToolExecutor.timeout_choice``), so a long CI build is never cut at 120 s.
BASH_DEFAULT_TIMEOUT = 120.0
BASH_MAX_TIMEOUT = 600.0

BASH = Tool(
    name="bash",
    description=(
        "Run a shell command with bash in the working directory. Stdin is empty; stdout and "
        "stderr are combined. Returns the output and the exit status. Use `timeout` (seconds) for "
        "long commands; without it the run's default applies, and a value over the run's limit is "
        "capped (the result says so)."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "cwd": {"type": "string"},
            "timeout": {"type": "number"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    kind="shell",
    parallel_safe=False,
    timeout=BASH_DEFAULT_TIMEOUT,
    max_timeout=BASH_MAX_TIMEOUT,
)

_MAX_READ_LINES = 2000


def read_file(path: str, offset: int = 1, limit: int = _MAX_READ_LINES) -> str:
    """Read a text file; ``offset`` is the first line (1-based), ``limit`` the number of lines."""
    if offset < 1:
        raise ValueError("offset starts at 1")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    lines: list[str] = []
    total = 0
    # The escapes are undone line by line by andon's rule (U+FFFD), not by the decoder here.
    with open(name_path(path), encoding="utf-8", errors="surrogateescape") as f:
        for number, line in enumerate(f, start=1):
            total = number
            if offset <= number < offset + limit:
                lines.append(clean_text(line))
    text = "".join(lines)
    last = offset + len(lines) - 1
    if total > last:
        text += f"\n[lines {offset}-{last} of {total}; use offset to read more]"
    return text


def write_file(path: str, content: str) -> str:
    """Write a text file atomically (a temporary file renamed over the target)."""
    data = content.encode()
    _replace(Path(name_path(path)), data)
    return f"wrote {len(data)} bytes to {path}"


def _replace(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    import tempfile  # only for a file written whole: no worker's start pays its imports

    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def edit_file(path: str, old: str, new: str) -> str:
    """Replace the one exact occurrence of ``old`` with ``new`` in a text file."""
    target = Path(name_path(path))
    # Bytes that are not UTF-8 (a Latin-1 comment) are kept as they are around the edit: read
    # and written back as surrogate escapes, never replaced.
    text = target.read_bytes().decode("utf-8", "surrogateescape")
    count = text.count(old)
    if not old:
        raise ValueError("old must not be empty")
    if count == 0:
        raise ValueError(f"old text not found in {path}")
    if count > 1:
        raise ValueError(f"old text occurs {count} times in {path}; give more context")
    _replace(target, text.replace(old, new, 1).encode("utf-8", "surrogateescape"))
    return f"edited {path}"


def list_files(path: str = ".", pattern: str | None = None) -> str:
    """List files under ``path`` (recursively, skipping hidden folders), optionally by glob."""
    root = Path(name_path(path))
    if not root.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            rel = show_name(os.path.relpath(os.path.join(folder, name), root))
            shown = show_name(name)
            if pattern is None or fnmatch.fnmatch(shown, pattern) or fnmatch.fnmatch(rel, pattern):
                found.append(rel)
        if len(found) > 5000:
            found.append("[more than 5000 files; narrow the pattern]")
            break
    return "\n".join(found)


def grep(pattern: str, path: str = ".") -> str:
    """Search files under ``path`` for a regular expression; ``file:line: text`` per match."""
    regex = re.compile(pattern)
    root = Path(name_path(path))
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    hits: list[str] = []
    for file in files:
        if any(part.startswith(".") for part in file.parts[len(root.parts) :]):
            continue
        try:
            with open(file, "rb") as probe:
                if b"\0" in probe.read(8192):
                    continue  # binary: skipped, as grep -I does
            # A text file with a Latin-1 byte is still text: its lines are searched, and shown
            # by andon's rule (U+FFFD).
            with open(file, encoding="utf-8", errors="surrogateescape") as f:
                for number, line in enumerate(f, start=1):
                    if regex.search(line):
                        text = clean_text(line.rstrip())
                        hits.append(f"{show_name(str(file))}:{number}: {text}")
        except OSError:
            continue  # unreadable: skipped
        if len(hits) >= 1000:
            hits.append("[stopped after 1000 matches]")
            break
    return "\n".join(hits)


def _python_tool(fn: Callable[..., Any], *, parallel_safe: bool) -> Tool:
    made: Tool = tool(fn, parallel_safe=parallel_safe)
    return made


def default() -> ToolRegistry:
    """A fresh registry with the built-in tools: bash, read_file, write_file, edit_file,
    list_files, grep."""
    return ToolRegistry(
        [
            BASH,
            _python_tool(read_file, parallel_safe=True),
            _python_tool(write_file, parallel_safe=False),
            _python_tool(edit_file, parallel_safe=False),
            _python_tool(list_files, parallel_safe=True),
            _python_tool(grep, parallel_safe=True),
        ]
    )


# Keep the schemas honest at import time: a bad annotation fails here, not in a worker.
for _fn in (read_file, write_file, edit_file, list_files, grep):
    schema_from_signature(_fn)
