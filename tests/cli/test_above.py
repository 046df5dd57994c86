"""Lines printed above andon chat's prompt: the terminal stays raw, so a key pressed meanwhile
stays a key (a real pseudo-terminal, a real prompt_toolkit prompt)."""

from __future__ import annotations

import asyncio
import os
import sys
import termios
from collections.abc import Iterator
from typing import TextIO

import pytest
from prompt_toolkit import PromptSession
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_input
from prompt_toolkit.output import create_output

from andon.cli._above import printing_above


@pytest.fixture
def pty() -> Iterator[tuple[int, TextIO]]:
    """A pseudo-terminal: its master end and its slave end as a text file."""
    master, slave = os.openpty()
    with open(slave, "w", encoding="utf-8", closefd=True) as terminal:
        try:
            yield master, terminal
        finally:
            os.close(master)


class _Probe:
    """The terminal as the proxy sees it: records whether the tty was in canonical (cooked) mode
    at each write, and presses Ctrl-D in the middle of the first one."""

    def __init__(self, master: int, terminal: TextIO) -> None:
        self.master = master
        self.terminal = terminal
        self.canonical: list[bool] = []

    def write(self, text: str) -> int:
        lflag = termios.tcgetattr(self.terminal.fileno())[3]
        self.canonical.append(bool(lflag & termios.ICANON))
        if len(self.canonical) == 1:
            os.write(self.master, b"\x04")  # the key lands while the line is being printed
        return self.terminal.write(text)

    def flush(self) -> None:
        self.terminal.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.terminal.fileno()


def test_ctrl_d_pressed_while_a_line_prints_still_quits_the_prompt(
    pty: tuple[int, TextIO],
) -> None:
    master, terminal = pty
    probe = _Probe(master, terminal)
    loop = asyncio.new_event_loop()
    # The prompt's rendering goes to the pty: drain it so a write never blocks.
    loop.add_reader(master, lambda: os.read(master, 65536))

    async def chat() -> None:
        with create_app_session(input=create_input(terminal), output=create_output(terminal)):
            session: PromptSession[str] = PromptSession()
            ready = asyncio.Event()
            prompt = asyncio.ensure_future(session.prompt_async("› ", pre_run=ready.set))
            await ready.wait()
            saved = sys.stdout
            sys.stdout = probe
            try:
                with printing_above(session.app):
                    print("▶ c1-1-1 bash")
                    with pytest.raises(EOFError):
                        await asyncio.wait_for(prompt, 10)
            finally:
                sys.stdout = saved

    try:
        loop.run_until_complete(chat())
    finally:
        loop.remove_reader(master)
        loop.close()
    # prompt_toolkit's patch_stdout writes in cooked mode, where the tty turns Ctrl-D into a NUL
    # byte and the prompt never sees it.
    assert probe.canonical == [False]


def test_a_partial_line_waits_for_its_end_and_what_is_left_is_written_at_the_end(
    pty: tuple[int, TextIO],
) -> None:
    master, terminal = pty
    probe = _Probe(master, terminal)
    written: list[str] = []
    probe.terminal = _Recorder(terminal, written)  # type: ignore[assignment]

    async def main() -> None:
        saved = sys.stdout
        sys.stdout = probe
        try:
            with printing_above(None):  # no prompt running: written as it comes
                sys.stdout.write("half")
                assert written == []
                sys.stdout.write(" a line\nand a tail")
                assert written == ["half a line\n"]
        finally:
            sys.stdout = saved

    asyncio.run(main())
    assert written == ["half a line\n", "and a tail"]


class _Recorder:
    def __init__(self, terminal: TextIO, written: list[str]) -> None:
        self._terminal = terminal
        self.written = written

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._terminal.fileno()
