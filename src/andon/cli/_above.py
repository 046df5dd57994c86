"""Printing above ``andon chat``'s prompt without ever leaving raw mode.

prompt_toolkit's own ``patch_stdout`` prints through ``run_in_terminal``, which switches the
terminal to cooked mode for every write. A key pressed in that moment is taken by the tty's line
discipline instead of the prompt: Ctrl-D becomes a NUL byte (the quit is lost and the chat waits
for ever), other keys are echoed over the screen. A chat that prints while a turn runs hits that
window often, so here the terminal stays raw throughout: the prompt is erased, the whole lines are
written where it was, and the prompt is drawn again below them. Every key stays a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO


class AbovePrompt:
    """``sys.stdout``/``sys.stderr`` while the prompt runs: whole lines go above the prompt.

    A partial line waits for its newline (the prompt is drawn from where the text ends, so it must
    end a line); what is left at :meth:`close` is written as it is. Writes from another thread are
    handed to the event loop, which owns the terminal."""

    def __init__(self, app: Any, stream: TextIO, loop: asyncio.AbstractEventLoop) -> None:
        self._app = app
        self._stream = stream
        self._loop = loop
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._pending = ""
        self.encoding = getattr(stream, "encoding", None) or "utf-8"
        self.errors = getattr(stream, "errors", None) or "strict"

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            head, newline, self._pending = self._pending.rpartition("\n")
        if newline:
            self._submit(head + newline)
        return len(text)

    def flush(self) -> None:
        pass  # whole lines are written as they come; a partial one waits for its end

    def close(self) -> None:
        """Write what is left (called once the prompt is gone)."""
        with self._lock:
            rest, self._pending = self._pending, ""
        if rest:
            self._submit(rest)

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def _submit(self, text: str) -> None:
        if threading.get_ident() == self._thread:
            self._print(text)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing shows it
                self._loop.call_soon_threadsafe(self._print, text)

    def _print(self, text: str) -> None:
        app = self._app
        running = app is not None and app.is_running
        if running:
            app.renderer.erase()  # the cursor goes back to where the prompt starts
        self._stream.write(text)
        self._stream.flush()
        if running:
            app.invalidate()  # drawn again, from the line after the text


@contextlib.contextmanager
def printing_above(app: Any) -> Iterator[AbovePrompt]:
    """Route ``sys.stdout`` and ``sys.stderr`` above ``app``'s prompt (on the running loop)."""
    proxy = AbovePrompt(app, sys.stdout, asyncio.get_running_loop())
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = proxy
    try:
        yield proxy
    finally:
        sys.stdout, sys.stderr = saved
        proxy.close()
