"""``andon chat``: talk to the agent while it works.

The prompt (prompt_toolkit, asyncio) stays usable while a turn runs; what the agent prints goes
above it (:mod:`andon.cli._above`: the terminal stays raw, so no key pressed while a line prints
is lost), and the bottom toolbar shows the live area of the terminal view (the
running tool calls with a spinner, elapsed time and output tail, the stopping status) and the queue.

Keys and commands:

* Enter: queue the line as a follow-up (it starts at once when the agent is idle); Enter on an
  empty line wakes the agent if queued work is parked (after ``/cancel keep``; quitting drops it);
* ``/steer TEXT``, ``/inject TEXT``: into the next step of the running turn;
* Esc or Ctrl-C: cancel the running turn (the queue is dropped); a second Ctrl-C during the same
  stop kills the tool process groups now; at an idle prompt Ctrl-C only clears the line;
* ``/cancel keep``: cancel the running turn, keep the queue; ``/cancel``: cancel and drop it;
* Ctrl-D (on an empty line) or ``/quit``: dispose the agent (no process left) and exit.

Signals: SIGINT arriving while no prompt owns the terminal (e.g. while quitting) is handled as
Ctrl-C; SIGTERM and SIGHUP dispose the agent and exit with 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from andon.base import ConfigError, Disposed, User, plural
from andon.cli._settings import Settings, add_agent_options, resolve

# Every andon command builds the parser and so loads this module, for ``register``: the
# terminal view and the session's classes are imported where chat uses them.
if TYPE_CHECKING:
    from andon.cli._setup import JobBase
    from andon.cli._term import TermOutput
    from andon.session import AgentEvent

__all__ = ["register", "run"]

_HANDLED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HELP: Final = (
    "Enter queues a follow-up · /steer TEXT · /inject TEXT · Esc or Ctrl-C cancels the turn "
    "(twice: kill now) · /cancel keep · /compact (summarise the history now) · Ctrl-D quits"
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``chat`` to the ``andon`` subcommands."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "chat", help="interactive: type while the agent works"
    )
    p.add_argument("--session", metavar="DIR", help="session folder (an existing one is resumed)")
    add_agent_options(p, job=False)
    return p


@dataclass
class _Job:
    session: Path
    settings: Settings
    base: JobBase
    queued: tuple[int, int] = (0, 0)  # parked work of a resumed session (next-turn, next-step)
    session_id: str | None = None  # a new session under the root: its folder's name is its id


def run(args: argparse.Namespace) -> int:
    """Run ``andon chat`` (usage and configuration errors raise before anything starts)."""
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        raise ConfigError("andon chat needs a terminal; use 'andon run' in scripts and CI")
    return asyncio.run(_chat(_job(args)))


def _job(args: argparse.Namespace) -> _Job:
    from andon.cli._sessions import new_session_dir
    from andon.cli._setup import job_base, read_existing

    flags = {k: v for k, v in vars(args).items() if k not in ("session",)}
    settings = resolve(flags)
    session = Path(args.session) if args.session else new_session_dir()
    new_id = None if args.session else session.name
    existing = read_existing(session) if (session / "events.jsonl").exists() else None
    queued = (0, 0)
    if existing is not None:
        queued = (len(existing.state.next_turn), len(existing.state.next_step))
    return _Job(session, settings, job_base(settings, existing), queued, new_id)


@dataclass
class _Chat:
    """The chat's state, touched only on the event loop."""

    out: TermOutput
    agent: Any = None
    app: Any = None  # the prompt_toolkit Application while a prompt runs
    stops: int = 0  # Ctrl-C/Esc presses during the current stop (0: no stop pending)
    signal_first: int | None = None
    quitting: bool = False
    queue: dict[str, int] = field(default_factory=lambda: {"next-turn": 0, "next-step": 0})
    compacting: asyncio.Task[None] | None = None  # a /compact in progress

    @property
    def running(self) -> bool:
        return self.agent is not None and self.agent.status == "running"

    def fold(self, event: AgentEvent) -> None:
        """Keep the visible queue in step with the inbox splices; a turn's end ends a stop."""
        from andon.session import InboxSpliced, Record, TurnEnd

        match event:
            case Record(data=InboxSpliced(target=target, inserted=inserted) as splice):
                n = self.queue[target] + len(inserted)
                self.queue[target] = max(0, n - splice.removed)
                if splice.outcome == "canceled" and splice.removed:
                    # A cancel drops the queue (the log says so): say it on screen too, or the
                    # follow-ups typed during the turn vanish without a word.
                    what = "queued follow-up" if target == "next-turn" else "queued step message"
                    self.out.line(
                        f"dropped {plural(splice.removed, what)} "
                        "(/cancel keep cancels and keeps the queue)",
                        "yellow",
                    )
            case Record(data=TurnEnd()):
                self.stops = 0
            case _:
                pass
        self.invalidate()

    def invalidate(self) -> None:
        if self.app is not None:
            self.app.invalidate()

    def interrupt(self, key: str, *, allow_force: bool = True) -> bool:
        """Esc/Ctrl-C: cancel the running turn; again (Ctrl-C) to force. False when idle."""
        if not self.running:
            return False
        self.stops += 1
        if self.stops == 1:
            self.out.stopping(key, "user")
            self.agent.cancel(User())
        elif allow_force:
            self.out.forcing(key)
            self.agent.cancel(User(), force=True)
        self.invalidate()
        return True

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and not self.quitting:
            self.interrupt(name)
            return
        if self.signal_first is None:
            self.signal_first = signum
        if self.agent is not None and self.running:
            if self.stops == 0:
                self.stops = 1
                self.out.stopping(name, "disposed")
                self.agent.cancel(Disposed())
            else:
                self.out.forcing(name)
                self.agent.cancel(User(), force=True)
        self.quit()

    def quit(self) -> None:
        self.quitting = True
        if self.app is not None and self.app.is_running:
            self.app.exit(exception=EOFError())

    def prompt(self) -> Any:
        """The prompt: the live area, a status line with the queue, then the input line.

        (Not a bottom toolbar: prompt_toolkit shows that only once the terminal answered a cursor
        position request, and the live area must show everywhere.)"""
        from prompt_toolkit.formatted_text import ANSI
        from rich.text import Text

        from andon.cli._term import to_ansi

        lines = self.out.live_lines()
        queued = self.queue["next-turn"]
        steps = self.queue["next-step"]
        status = "running" if self.running else "idle"
        tail = f"[{status} · queued: {queued} follow-up(s)"
        if steps:
            tail += f", {steps} for the next step"
        lines.append(Text(tail + "]", "dim"))
        return ANSI(to_ansi(lines, shutil.get_terminal_size().columns) + "\n› ")


async def _chat(job: _Job) -> int:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings
    from rich.console import Console

    from andon.cli._above import printing_above
    from andon.cli._term import TermOutput
    from andon.supervisor import open_agent

    loop = asyncio.get_running_loop()
    width = shutil.get_terminal_size().columns
    # file=None: rich writes to whatever sys.stdout is at print time (printing_above's proxy).
    console = Console(force_terminal=True, width=width, highlight=False)
    out = TermOutput(job.settings.grace, console=console)
    chat = _Chat(out)
    chat.queue["next-turn"], chat.queue["next-step"] = job.queued
    for signum in _HANDLED:
        loop.add_signal_handler(signum, chat.on_signal, signum)
    started = time.monotonic()
    out.line(f"andon chat: session {job.session}", "bold")
    out.line(_HELP, "dim")
    if sum(job.queued):
        out.line(f"{sum(job.queued)} queued item(s) parked; Enter on an empty line runs them")
    from andon.cli._setup import agent_options, context_window_for

    options = agent_options(
        job.settings,
        model=job.base.model,
        cwd=job.base.cwd,
        system_prompt=job.base.system_prompt,
        session_id=job.session_id,
        instructions=job.base.instructions,
        context_window=await context_window_for(job.settings, job.base.model),
    )
    try:
        async with open_agent(job.session, **options) as agent:
            events = agent.events(since_seq=job.base.since_seq)
            shown = asyncio.create_task(_show_events(events, chat))
            chat.agent = agent
            bindings = KeyBindings()

            @bindings.add("c-c")
            def _ctrl_c(event: Any) -> None:
                if not chat.interrupt("Ctrl-C"):
                    event.app.current_buffer.reset()  # idle: just clear the line

            @bindings.add("escape", eager=True)
            def _escape(event: Any) -> None:
                chat.interrupt("Esc", allow_force=False)

            session: PromptSession[str] = PromptSession(
                key_bindings=bindings,
                refresh_interval=0.1,
                erase_when_done=True,
            )
            with printing_above(session.app):
                while not chat.quitting:
                    chat.app = session.app
                    try:
                        # handle_sigint=False: prompt_toolkit's own SIGINT handler would turn a
                        # SIGINT into KeyboardInterrupt here and, once the prompt returns, remove
                        # the loop's handler for good (asyncio then drops every later SIGINT).
                        text = await session.prompt_async(chat.prompt, handle_sigint=False)
                    except EOFError:
                        break
                    except KeyboardInterrupt:
                        continue
                    finally:
                        chat.app = None
                    if _command(chat, text):
                        break
                chat.quitting = True
                if chat.running:
                    chat.stops = max(chat.stops, 1)  # a Ctrl-C now kills at once
                    out.line("quitting: stopping the running turn (Ctrl-C to kill now)", "yellow")
            # Leaving the block disposes the agent (the stopping status still prints).
    finally:
        for signum in _HANDLED:
            loop.remove_signal_handler(signum)
    with contextlib.suppress(asyncio.CancelledError):
        await shown
    code = 128 + chat.signal_first if chat.signal_first is not None else 0
    out.summary(
        {
            "session": str(job.session),
            "exit_code": code,
            "turns": out.tracker.turns,
            "tool_calls": out.tracker.tool_calls,
            "duration": round(time.monotonic() - started, 3),
            "ended": out.tracker.last_end,
        }
    )
    return code


def _command(chat: _Chat, text: str) -> bool:
    """Act on one entered line; True to quit."""
    agent = chat.agent
    out = chat.out
    line = text.strip()
    if not line:
        if not chat.running and agent.wake():
            out.line("running the queued work", "dim")
        return False
    out.line(f"› {text}", "bold")
    if not line.startswith("/"):
        running = chat.running
        agent.followup(text)
        if running:
            out.line(f"queued follow-up: {line}", "cyan")
        return False
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    match name:
        case "/quit" | "/exit":
            return True
        case "/steer" | "/inject" if rest:
            getattr(agent, name[1:])(rest)
            out.line(f"{name[1:]}: {rest}", "cyan")
        case "/cancel" if rest in ("", "keep"):
            keep = rest == "keep"
            was_running = chat.running
            if was_running:
                chat.stops = max(chat.stops, 1)
                out.stopping("/cancel", "user")
            agent.cancel(User(), keep_inbox=keep)
            if keep:
                n = chat.queue["next-turn"] + chat.queue["next-step"]
                out.line(
                    f"canceled; {n} queued item(s) kept (Enter on an empty line runs them)",
                    "yellow",
                )
            elif not was_running:
                out.line("nothing running; the queue is cleared", "dim")
        case "/compact" if not rest:
            if chat.running or chat.compacting is not None:
                out.line("/compact waits for an idle agent: the turn or a compaction runs", "dim")
            else:
                chat.compacting = asyncio.get_running_loop().create_task(_compact(chat))
        case "/help":
            out.line(_HELP, "dim")
        case _:
            out.line(f"unknown command {line!r}; {_HELP}", "red")
    return False


async def _compact(chat: _Chat) -> None:
    """``/compact``: summarise the history now, as a maintenance job (docs/agent-loop.md,
    Compaction); /cancel stops it, and a message typed meanwhile waits for it."""
    from andon.base import Aborted, AndonError

    out = chat.out
    out.line("compacting the history …", "dim")
    try:
        changed = await chat.agent.compact(force=True)
    except Aborted:
        out.line("compaction stopped; nothing was changed", "yellow")
    except (AndonError, RuntimeError) as e:
        out.line(f"compaction failed: {e}", "red")
    else:
        out.line("history compacted" if changed else "nothing to compact", "dim")
    finally:
        chat.compacting = None
        chat.invalidate()


async def _show_events(events: AsyncIterator[AgentEvent], chat: _Chat) -> None:
    async for event in events:
        chat.out.feed(event)
        chat.fold(event)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="andon")
    register(parser.add_subparsers(dest="command", required=True))
    return parser
