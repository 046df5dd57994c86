"""A new session folder appears under its name only with its first record durable.

A process killed while it opens a new session (a CI runner's SIGKILL during start-up, say) must
leave either no session or one that loads: a folder named like a session but without a log would
be refused by ``resume`` forever. So a new folder is built under a hidden temporary name beside
the final one (``.<name>.new-<token>``, same parent: a rename never crosses a file system), the
lock is taken and the first record written and synced there, and only then is it renamed to its
name, without replacing anything that appeared there meanwhile (``renameat2(RENAME_NOREPLACE)``).

A kill before the rename leaves a hidden ``.….new-…`` folder, which nothing lists or loads; a
writer closed before its first record removes its own temporary folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Final

from andon.base import naming_file
from andon.session._lock import LOCK_NAME
from andon.session._reader import LOG_NAME

__all__ = ["is_temporary", "make_temporary", "publish", "remove_temporary"]

_MARK: Final = ".new-"
_AT_FDCWD: Final = -100
_RENAME_NOREPLACE: Final = 1


def is_temporary(name: str) -> bool:
    """Whether a folder name is a session still being created (or whose creator died)."""
    return name.startswith(".") and _MARK in name


def make_temporary(final: Path) -> Path:
    """Create (0700) and return the hidden folder a new session at ``final`` is built in."""
    for _ in range(8):
        work = final.parent / f".{final.name}{_MARK}{secrets.token_hex(4)}"
        try:
            work.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(work, 0o700)  # mkdir's mode is filtered by the umask
        return work
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(final))


def publish(work: Path, final: Path, *, sync: bool) -> None:
    """Rename ``work`` to ``final``; raises ``FileExistsError`` if ``final`` exists (it is never
    replaced). With ``sync``, the parent folder is synced so that the name survives a machine
    crash, as the first record does."""
    _rename_noreplace(work, final)
    if sync:
        dir_fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with naming_file(final.parent):
                os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def remove_temporary(work: Path) -> None:
    """Remove a temporary folder this process holds the lock of and wrote no record into."""
    for name in (LOG_NAME, LOCK_NAME):
        with contextlib.suppress(FileNotFoundError):
            (work / name).unlink()
    with contextlib.suppress(OSError):  # not empty: something else is in there, leave it
        work.rmdir()


def _rename_noreplace(src: Path, dst: Path) -> None:
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE):
            err = ctypes.get_errno()
            if err not in (errno.ENOSYS, errno.EINVAL):  # EINVAL: a file system without the flag
                raise OSError(err, os.strerror(err), str(dst))
        else:
            return
    # Without renameat2: check, then rename. ``rename`` onto an existing folder fails unless it is
    # empty, so at worst an empty folder created in between these two lines is replaced.
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


_RENAMEAT2: list[Callable[..., int] | None] = []  # looked up once


def _renameat2() -> Callable[..., int] | None:
    """glibc's ``renameat2`` (2.28+), or ``None`` where the C library has none."""
    if not _RENAMEAT2:
        fn = None
        with contextlib.suppress(OSError, AttributeError):
            # The process's own symbols (libc is linked in): find_library("c") would run
            # ``ldconfig -p``, a whole process, on every new session.
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
            c_int, c_path = ctypes.c_int, ctypes.c_char_p
            fn.argtypes = (c_int, c_path, c_int, c_path, ctypes.c_uint)
            fn.restype = ctypes.c_int
        _RENAMEAT2.append(fn)
    return _RENAMEAT2[0]
