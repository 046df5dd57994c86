"""Small files a user names (``andon.toml``, a JSON Schema, ``AGENTS.md``), read the one safe way.

Each is opened non-blocking and looked at with ``fstat`` before a byte is read: a FIFO or a
device that happens to bear the name would otherwise hang the start (or never end the read),
and a folder is named for what it is. At most ``limit + 1`` bytes are read, so an accidental
multi-gigabyte file costs nothing and the caller can tell that it was over.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

__all__ = ["SmallFile", "UnreadableFile", "read_small_file"]


class UnreadableFile(Exception):
    """Why a small file cannot be used, in words a one-line error can end with (``cannot read
    it: Permission denied``, ``is a folder, not a file``, ``is not a regular file``). A missing
    file raises ``FileNotFoundError`` instead, which some callers take as "none"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SmallFile:
    data: bytes  # at most ``limit + 1`` bytes: longer means the file is over the limit
    size: int  # the file's size as ``fstat`` said it

    def over(self, limit: int) -> bool:
        return len(self.data) > limit


def read_small_file(path: str | os.PathLike[str], limit: int) -> SmallFile:
    """The first ``limit + 1`` bytes of the regular file at ``path`` (symlinks followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UnreadableFile(f"cannot read it: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableFile("is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile("is not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UnreadableFile(f"cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return SmallFile(data, info.st_size)
