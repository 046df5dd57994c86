"""Project instructions: the ``AGENTS.md`` files from the git root down to the working directory,
added to the system prompt after its base text (docs/agent-loop.md, Project instructions).

Reading them is never a reason not to run: a file that cannot be used (unreadable, not a regular
file, a symlink out of the tree) is skipped with one warning, as git skips an unreadable
``.gitignore``. A symlink that leaves the tree is refused because whatever it names would be sent
to the model provider: a repository must not be able to make andon ship ``~/.ssh/id_ed25519``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from andon.base import UnreadableFile, clean_text, read_small_file, show_name
from andon.session import InstructionFile, ProjectInstructions

__all__ = [
    "INSTRUCTIONS_FILE",
    "MAX_INSTRUCTION_BYTES",
    "FoundInstructions",
    "find_project_instructions",
]

INSTRUCTIONS_FILE: Final = "AGENTS.md"
"""The file name looked for at each level (the convention peer agent CLIs share)."""

MAX_INSTRUCTION_BYTES: Final = 64 * 1024
"""The most of one file that reaches the prompt; the rest is dropped, and the prompt and the log
say so. Instructions are read by the model on every request: a file larger than this is more
likely a mistake (a generated file, a log) than guidance."""

_HEADING: Final = (
    "# Project instructions\n\n"
    "The files below are this project's AGENTS.md, from the repository root down to the working "
    "directory. Where they disagree, the later one (nearer the working directory) wins."
)


@final
@dataclass(frozen=True, slots=True)
class FoundInstructions:
    """What :func:`find_project_instructions` found: the text to add to the system prompt (empty
    when nothing was found), what ``session/start`` records of it, and a warning per file that
    was skipped."""

    section: str = ""
    record: ProjectInstructions | None = None
    warnings: tuple[str, ...] = ()

    def add_to(self, base: str) -> str:
        """The system prompt: ``base``, then the instructions (``record.chars`` is their
        length, so that a resume can take them off again)."""
        return base + self.section


def git_root(folder: Path) -> Path | None:
    """The nearest of ``folder`` and its ancestors that has a ``.git`` entry (a folder, or the
    file of a worktree or submodule), or None."""
    for candidate in (folder, *folder.parents):
        try:
            os.lstat(candidate / ".git")
        except OSError:
            continue
        return candidate
    return None


def find_project_instructions(cwd: str | os.PathLike[str]) -> FoundInstructions:
    """The ``AGENTS.md`` files from the git root of ``cwd`` down to ``cwd`` (only ``cwd``'s own
    without a git root), outermost first. Never raises for a file: a file it cannot use is a
    warning, an empty one is skipped silently."""
    here = Path(os.path.realpath(cwd))
    root = git_root(here) or here
    folders = [root]
    for part in here.relative_to(root).parts:
        folders.append(folders[-1] / part)
    files: list[InstructionFile] = []
    texts: list[str] = []
    warnings: list[str] = []
    for folder in folders:
        path = folder / INSTRUCTIONS_FILE
        name = show_name(str(path.relative_to(root)))
        try:
            got = _read(path, root)
        except _Skip as e:
            warnings.append(f"project instructions {name} skipped: {e}")
            continue
        if got is None:
            continue
        data, truncated, size = got
        text = clean_text(data)
        if not text.strip():
            continue  # an empty file says nothing
        if truncated:
            warnings.append(
                f"project instructions {name}: only its first {len(data)} of {size} bytes are "
                f"used (at most {MAX_INSTRUCTION_BYTES} of a file)"
            )
            text += (
                f"\n[andon read only the first {len(data)} of {size} bytes of {name}; "
                "the rest is not shown]"
            )
        files.append(
            InstructionFile(name, hashlib.sha256(data).hexdigest(), len(data), truncated=truncated)
        )
        texts.append(f"--- {name} ---\n{text.rstrip()}")
    if not files:
        return FoundInstructions(warnings=tuple(warnings))
    section = "\n\n" + "\n\n".join([_HEADING, *texts]) + "\n"
    record = ProjectInstructions(show_name(str(root)), tuple(files), len(section))
    return FoundInstructions(section, record, tuple(warnings))


class _Skip(Exception):
    """A file that is there but cannot be used; the message says why."""


def _read(path: Path, root: Path) -> tuple[bytes, bool, int] | None:
    """The bytes to use of ``path`` (at most the cap, cut on a character boundary), whether they
    were cut, and the file's size; None when there is no such file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Skip(f"cannot look at it: {e.strerror or e}") from None
    target = path
    if stat.S_ISLNK(info.st_mode):
        target = Path(os.path.realpath(path))
        if not target.exists():
            raise _Skip("a symlink to nothing") from None
        if target != root and root not in target.parents:
            raise _Skip(f"a symlink to {show_name(str(target))}, outside {show_name(str(root))}")
    try:
        # The one safe way: a FIFO called AGENTS.md is refused instead of hanging the start.
        found = read_small_file(target, MAX_INSTRUCTION_BYTES)
    except FileNotFoundError:
        raise _Skip("cannot read it: No such file or directory") from None
    except UnreadableFile as e:
        raise _Skip(e.reason.removeprefix("is ")) from None
    data = found.data
    if not found.over(MAX_INSTRUCTION_BYTES):
        return data, False, len(data)
    cut = _boundary(data, MAX_INSTRUCTION_BYTES)
    return data[:cut], True, max(found.size, len(data))


def _boundary(data: bytes, end: int) -> int:
    """``end``, or less so that a UTF-8 sequence the cut at ``end`` would split is dropped whole
    (rather than becoming U+FFFD). Bytes that are not UTF-8 anyway are left to ``clean_text``."""
    back = 0  # continuation bytes (10xxxxxx) just before the cut
    while back < 3 and end - back > 0 and data[end - back - 1] & 0xC0 == 0x80:
        back += 1
    lead = end - back - 1
    if lead < 0:
        return end
    first = data[lead]
    length = (
        2
        if first & 0xE0 == 0xC0
        else 3
        if first & 0xF0 == 0xE0
        else 4
        if first & 0xF8 == 0xF0
        else 1
    )
    return lead if length > back + 1 else end
