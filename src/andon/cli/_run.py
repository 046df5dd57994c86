"""``andon run`` and ``andon resume``: one job, an honest exit code, nothing left running.

Order matters here (docs/ci.md, Timeouts and cancellation): ``main`` handles signals from its first
instruction (``andon.cli._signals``); the loop's handlers take over as the first thing on the event
loop, before the log is opened or a worker starts, so that a Ctrl-C at any moment becomes a cancel
rather than a ``KeyboardInterrupt`` that skips the clean-up; and after the loop the signals stay
handled (recorded only) until the process exits. A signal that arrives before the agent exists
means no agent is opened at all: no session folder, nothing started.

Everything that can be refused as a usage or configuration error (flags,
settings, the model spec and its key, the script file, the prompt) is checked before the agent
starts, and gives exit code 2.

Exit code precedence: usage/config error before the agent starts (2); once a signal arrived,
128 + the first signal's number, even if the turn then completed; a closed stdout counts as
SIGPIPE (141); otherwise the last ``turn/end`` decides (see :func:`exit_code_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from andon.base import ConfigError, Disposed, User, session_id
from andon.cli._output import (
    JsonOutput,
    Output,
    StdoutClosed,
    TextOutput,
    install_log_handler,
    say,
)
from andon.cli._prices import cost
from andon.cli._settings import Settings
from andon.cli._signals import LEDGER, record_only
from andon.cli._workers import launcher_of
from andon.llm import Model, from_spec

__all__ = [
    "RunJob",
    "agent_options",
    "exit_code_for",
    "new_session_dir",
    "run_job",
    "runtime_root",
    "sessions_root",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_BLOCKED: Final = 3
EXIT_MAX_TOKENS: Final = 4
EXIT_HOOK: Final = 5
EXIT_EPIPE: Final = 128 + signal.SIGPIPE


def exit_code_for(reason: Mapping[str, Any] | None) -> int:
    """The exit code a run without signals gets from its last ``turn/end`` reason."""
    if reason is None:
        return EXIT_OK
    match reason.get("kind"):
        case "completed":
            return EXIT_OK
        case "blocked":
            return EXIT_BLOCKED
        case "max-tokens":
            return EXIT_MAX_TOKENS
        case "aborted" if (reason.get("reason") or {}).get("kind") == "hook":
            return EXIT_HOOK
        case _:
            return EXIT_FAILED


@dataclass
class RunJob:
    """Everything decided before the event loop starts."""

    session: Path
    settings: Settings
    model: Model
    prompt: str | None  # None: resume without a prompt (wake on queued work)
    json: bool
    cwd: str | None
    system_prompt: str | None
    created: bool  # a new session folder (its path is announced)
    since_seq: int = 0  # the first record this run writes (repair closers included)
    session_id: str | None = None  # a new session's id (its folder under the root is named so)


@dataclass
class _Signals:
    """What a signal does during the loop; the handlers run on the loop (never inside a callback
    of ours). The counts live in the process-wide ledger, so a signal received before the loop
    started counts as the first."""

    out: Output
    session: Path
    agent: Any = None  # the Agent once it exists

    @property
    def first(self) -> int | None:
        return LEDGER.first

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        LEDGER.early = False  # from here on a signal stops the run instead of unwinding main
        for signum in LEDGER.handled:
            loop.add_signal_handler(signum, self.on_signal, signum)

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        LEDGER.record(signum)
        agent = self.agent
        if LEDGER.count == 1:
            cause = User() if signum == signal.SIGINT else Disposed()
            if agent is None:
                say(f"{name}: stopping before the agent started")
                return
            self.out.stopping(name, cause.kind)
            agent.cancel(cause)
        elif LEDGER.count == 2 or signum != signal.SIGINT:
            if agent is not None:
                self.out.forcing(name)
                agent.cancel(User(), force=True)  # the first cause stays; force kills now
        else:
            self.hard_exit()

    def hard_exit(self) -> None:
        """Third Ctrl-C: SIGKILL the processes of every tool call still running, then exit at
        once. The workers see this process die (pidfd) and exit; the next load repairs the log.

        The calls' processes are found as crash repair finds them (their tag and start time, or
        their proven cgroup, from the log): never a bare group id, which by now may be another
        session's."""
        from andon.session import kill_in_flight, read

        killed = 0
        with contextlib.suppress(Exception):
            killed = kill_in_flight(read(self.session))
        calls = len(self.out.tracker.in_flight)
        say(
            f"SIGINT a third time: killed {killed} process(es) of {calls} tool call(s); exiting now"
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(128 + (self.first or signal.SIGINT))


class HoldingLoop(asyncio.SelectorEventLoop):
    """The event loop of ``andon run``: when it lets go of a signal (at close), the signal goes
    to the recording handler in one swap, never through the default action.

    The base loop restores ``SIG_DFL`` (``default_int_handler`` for SIGINT) when it closes; a
    signal after that, delivered to any thread of the process (the log's sync thread, say), would
    kill andon by the default action and change its exit status after ``run/summary`` was
    printed. Blocking the signals would not help: a mask is per thread.
    """

    def remove_signal_handler(self, sig: int) -> bool:
        if sig not in LEDGER.handled:
            return super().remove_signal_handler(sig)
        signal.signal(sig, record_only)  # atomic: from the loop's handler straight to ours
        # The loop's wakeup socket is about to close; a signal must not be written to it.
        signal.set_wakeup_fd(-1)
        return True


def load_model(spec: str | None, thinking: bool | None) -> Model:
    if not spec:
        raise ConfigError(
            "no model: give --model SPEC (or ANDON_MODEL, or model = ... in andon.toml), e.g. "
            "--model deepseek-v4-flash or --model script:examples/ci-build/script.yaml"
        )
    return from_spec(spec, thinking=thinking)


def run_job(job: RunJob) -> int:
    """Run ``job`` on a fresh event loop and return the exit code."""
    # The loop hands its signals to the recording handler when it closes (HoldingLoop): from
    # here to the process's exit, a signal never acts by its default action.
    with asyncio.Runner(loop_factory=HoldingLoop) as runner:
        return runner.run(_run(job))


async def _run(job: RunJob) -> int:
    loop = asyncio.get_running_loop()
    install_log_handler()
    out = _output(job)
    signals = _Signals(out, job.session)
    signals.install(loop)  # first, before anything else starts
    return await _run_installed(job, out, signals)


async def _run_installed(job: RunJob, out: Output, signals: _Signals) -> int:
    live = _start_live(out)
    started = time.monotonic()
    outcome = _Outcome()
    try:
        if signals.first is None:
            await _drive(job, out, signals, outcome)
        else:
            # A signal landed before the agent existed: open nothing, start nothing.
            say(f"{signal.Signals(signals.first).name}: stopped before the run started")
    except BaseException as e:
        if signals.first is None or isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        # After a signal, whatever broke on the way down is reported in one line: the signal
        # decides the exit code (a pool start cut short, say).
        say(f"stopping after {signal.Signals(signals.first).name}: {_describe(e)}")
    finally:
        if live is not None:
            live.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live
    failure = outcome.failure
    if failure is not None:
        say(failure)
    if signals.first is not None:
        code = 128 + signals.first
    elif out.closed:
        code = EXIT_EPIPE
    elif failure is not None:
        code = EXIT_FAILED
    else:
        code = exit_code_for(out.tracker.last_end)
    ended = out.tracker.last_end
    if ended is not None and ended.get("kind") == "error" and not job.json:
        error = ended.get("error") or {}
        say(f"the turn failed: {error.get('code')}: {error.get('message')}")
    summary: dict[str, Any] = {
        "session": str(job.session),
        "session_id": outcome.session_id or _logged_session_id(job.session),
        "exit_code": code,
        "turns": out.tracker.turns,
        "tool_calls": out.tracker.tool_calls,
        "duration": round(time.monotonic() - started, 3),
        "final_text": out.tracker.final_text,
        "usage": _summary_usage(outcome.usage),
    }
    spent = cost(outcome.usage, job.model.info, job.settings.prices)
    if spent is not None:
        summary["cost"] = spent
    summary["ended"] = ended
    with contextlib.suppress(StdoutClosed):
        out.summary(summary)
    return code


_SUMMARY_USAGE: Final = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
"""The token counts ``run/summary`` always has (0 when the provider reported none)."""
_REPORTED_USAGE: Final = ("uncached_prompt_tokens", "reasoning_tokens")
"""The counts it has only when the provider reported them."""


def _summary_usage(totals: Mapping[str, Any]) -> dict[str, int]:
    """``usage`` of ``run/summary`` from the agent's totals (``Agent.usage``)."""
    usage = {key: _tokens(totals.get(key)) for key in _SUMMARY_USAGE}
    usage.update({key: _tokens(totals[key]) for key in _REPORTED_USAGE if key in totals})
    return usage


def _tokens(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _logged_session_id(folder: Path) -> str | None:
    """The ``session_id`` of the ``session/start`` in ``folder``'s log, if there is one: the id of
    a session whose agent never opened in this run (a signal during the start, a resume refused
    by the pool). None when no session was created."""
    try:
        with open(folder / "events.jsonl", "rb") as f:
            first = json.loads(f.readline(1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(first, dict) or first.get("type") != "session/start":
        return None
    data = first.get("data")
    if not isinstance(data, dict):
        return None
    sid = data.get("session_id")
    return sid if isinstance(sid, str) else None


@dataclass
class _Outcome:
    failure: str | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0}
    )
    session_id: str | None = None  # of the agent that opened (its session/start)


async def _drive(job: RunJob, out: Output, signals: _Signals, outcome: _Outcome) -> None:
    """Open the agent, send the prompt (or wake), wait until idle, and take it all down."""
    import andon
    from andon.hooks import TurnBudget

    s = job.settings
    hooks = []
    if s.turn_budget is not None or s.max_steps is not None:
        hooks.append(TurnBudget(seconds=s.turn_budget, steps=s.max_steps))
    # A SessionLive or ConfigError raised while opening leaves here wrapped in an exception
    # group; ``andon.cli.main`` reports it as one line with exit code 2.
    async with asyncio.TaskGroup() as tg:  # noqa: SIM117 (the renderer outlives the agent)
        async with andon.open_agent(
            job.session,
            **agent_options(
                job.settings,
                model=job.model,
                cwd=job.cwd,
                system_prompt=job.system_prompt,
                session_id=job.session_id,
            ),
            hooks=hooks,
        ) as agent:
            outcome.session_id = agent.session_id
            events = agent.events(since_seq=job.since_seq)
            tg.create_task(_render(events, out, agent))
            # A reader that went away disposes the agent at once, not at the next event.
            out.on_closed(lambda: agent.cancel(Disposed()))
            if signals.first is None:  # a signal during the pool's start: no turn at all
                signals.agent = agent
                if job.prompt is not None:
                    agent.followup(job.prompt)
                else:
                    # Resume without a prompt: the inbox holds work (checked before the loop).
                    agent.wake()
                try:
                    await agent.when_idle()
                except Exception as e:  # a log write failure: the agent stopped
                    outcome.failure = f"{type(e).__name__}: {e}"
            outcome.usage = dict(agent.usage)


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _describe(error.exceptions[0])
    return f"{type(error).__name__}: {error}"


def _output(job: RunJob) -> Output:
    """``--json``; the rich view when stdout is a terminal (``andon.cli._term``); else plain."""
    if job.json:
        return JsonOutput(job.settings.grace)
    try:
        tty = sys.stdout.isatty()
    except (OSError, ValueError):
        tty = False
    if tty:
        from andon.cli._term import TermOutput

        return TermOutput(job.settings.grace)
    return TextOutput(job.settings.grace)


def _start_live(out: Output) -> asyncio.Task[None] | None:
    """Redraw the rich view's live area (spinners, tails, stopping status) from the loop."""
    from andon.cli._term import TermOutput

    if not isinstance(out, TermOutput):
        return None
    return asyncio.get_running_loop().create_task(out.run_live())


async def _render(events: Any, out: Output, agent: Any) -> None:
    """Print every event; on a closed stdout, dispose the agent quietly and keep draining."""
    async for event in events:
        try:
            out.feed(event)
        except StdoutClosed:
            agent.cancel(Disposed())


def sessions_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where new sessions go without ``--session``: ``$ANDON_HOME/sessions``, by default
    ``${XDG_STATE_HOME:-~/.local/state}/andon/sessions``. Outside the workspace on purpose: tools
    run there, and a ``git clean -fdx`` or ``rm -rf .andon`` must not delete a live log."""
    env = os.environ if environ is None else environ
    home = env.get("ANDON_HOME", "")
    if home:
        return Path(home).expanduser().absolute() / "sessions"
    state = env.get("XDG_STATE_HOME", "")
    if not state or not os.path.isabs(state):  # the XDG spec: a relative path is ignored
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "andon" / "sessions"


def agent_options(
    settings: Settings,
    *,
    model: Model,
    cwd: str | None,
    system_prompt: str | None,
    session_id: str | None,
) -> dict[str, Any]:
    """The ``open_agent`` options every CLI session takes from its settings (``andon run``,
    ``resume`` and ``chat``), so that one setting cannot reach one command and miss another."""
    import andon

    return {
        "model": model,
        "cwd": cwd,
        "pool": andon.WorkerPoolConfig(size=settings.workers, runtime_dir=runtime_root()),
        "grace": settings.grace,
        "system_prompt": system_prompt,
        "tool_timeout": settings.tool_timeout,
        "pass_env": settings.pass_env,
        "session_id": session_id,
        "launcher": launcher_of(settings.workers_in, settings.containers, cwd),
    }


def runtime_root(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the worker pool keeps its private socket folder: ``$XDG_RUNTIME_DIR`` if it is a
    folder, else ``run/`` beside the sessions root (created 0700). Never ``/tmp`` by default: a
    tool's ``rm -rf /tmp/*`` (a common CI clean-up) would delete the socket, and no replacement
    worker could reach the pool again. ``None`` (the pool's own fallback) if it cannot be made."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return xdg
    run = sessions_root(env).parent / "run"
    try:
        run.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return str(run)


def new_session_dir() -> Path:
    """A new session's folder under the root (the root is created with its parents, 0700), named
    by a fresh session id: pass ``session_id=path.name`` to ``open_agent`` so that its
    ``session/start`` records the same id."""
    root = sessions_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create the sessions folder {root}: {e.strerror or e} (set ANDON_HOME, or "
            "give --session DIR)"
        ) from None
    return root / session_id()
