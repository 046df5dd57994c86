"""``andon run`` and ``andon resume``: one job, an honest exit code, nothing left running.

Order matters here (docs/ci.md, Timeouts and cancellation): ``main`` handles signals from its first
instruction (``andon.cli._signals``); the loop's handlers take over as the first thing on the event
loop, before the log is opened or a worker starts, so that a Ctrl-C at any moment becomes a cancel
rather than a ``KeyboardInterrupt`` that skips the clean-up; and after the loop the signals stay
handled (recorded only) until the process exits. A signal that arrives before the loop means no
agent is opened at all: no session folder, nothing started; one while the agent opens cancels the
opening at once (the pool takes down what had started), without waiting for the workers' start.

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
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from andon.base import Disposed, NoWorkerStarted
from andon.cli._ladder import HoldingLoop, LoopSignals
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
from andon.cli._setup import agent_options, context_window_for
from andon.cli._signals import LEDGER
from andon.llm import Model

__all__ = ["RunJob", "exit_code_for", "run_job"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_BLOCKED: Final = 3
EXIT_MAX_TOKENS: Final = 4
EXIT_HOOK: Final = 5
EXIT_NO_WORKER: Final = 6  # no tool worker could be started (docs/ci.md, Exit codes)
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
    signals = LoopSignals(out, job.session)
    signals.install(loop)  # first, before anything else starts
    return await _run_installed(job, out, signals)


async def _run_installed(job: RunJob, out: Output, signals: LoopSignals) -> int:
    live = _start_live(out)
    if live is None:  # the terminal view has spinners and clocks of its own
        _watch(job, out)
    started = time.monotonic()
    outcome = _Outcome()

    def summarize(code: int) -> None:  # the hard exit's summary (andon.cli._ladder)
        usage = dict(signals.agent.usage) if signals.agent is not None else outcome.usage
        out.summary(_summary(job, out, outcome, code, started, usage))

    signals.summarize = summarize
    try:
        if signals.first is None:
            opening = asyncio.get_running_loop().create_task(_drive(job, out, signals, outcome))
            signals.opening = opening
            try:
                await opening
            except asyncio.CancelledError:
                if LEDGER.first is None or not opening.cancelled():
                    raise  # not the signal's cancel
                # A signal cancelled the start: what had started is down; the summary follows.
        else:
            # A signal landed before the agent existed: open nothing, start nothing.
            say(f"{signal.Signals(signals.first).name}: stopped before the run started")
    except BaseException as e:
        no_worker = _no_worker(e) if signals.first is None else None
        if no_worker is not None:
            # The pool gave up starting workers (bounded retries): one line, the summary, exit 6.
            outcome.failure, outcome.no_worker = str(no_worker), True
        elif signals.first is None or isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        else:
            # After a signal, whatever broke on the way down is reported in one line: the
            # signal decides the exit code (a pool start cut short, say).
            say(f"stopping after {signal.Signals(signals.first).name}: {_describe(e)}")
    finally:
        if out.liveness is not None:
            out.liveness.close()
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
    elif outcome.no_worker:
        code = EXIT_NO_WORKER
    elif failure is not None:
        code = EXIT_FAILED
    else:
        code = exit_code_for(out.tracker.last_end)
    ended = out.tracker.last_end
    if ended is not None and ended.get("kind") == "error" and not job.json:
        error = ended.get("error") or {}
        say(f"the turn failed: {error.get('code')}: {error.get('message')}")
    with contextlib.suppress(StdoutClosed):
        out.summary(_summary(job, out, outcome, code, started, outcome.usage))
    return code


def _summary(
    job: RunJob,
    out: Output,
    outcome: _Outcome,
    code: int,
    started: float,
    usage: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``run/summary`` of this run so far, with exit code ``code``."""
    summary: dict[str, Any] = {
        "session": str(job.session),
        "session_id": outcome.session_id or _logged_session_id(job.session),
        "exit_code": code,
        "turns": out.tracker.turns,
        "tool_calls": out.tracker.tool_calls,
        "duration": round(time.monotonic() - started, 3),
        "final_text": out.tracker.final_text,
        "usage": _summary_usage(usage),
    }
    spent = cost(usage, job.model.info, job.settings.prices)
    if spent is not None:
        summary["cost"] = spent
    summary["ended"] = out.tracker.last_end
    if outcome.failure is not None:
        summary["failure"] = outcome.failure
    return summary


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
    no_worker: bool = False  # the pool could not start any tool worker (exit 6)


def _no_worker(error: BaseException) -> NoWorkerStarted | None:
    """The pool's start failure, inside whatever task groups wrap it."""
    if isinstance(error, NoWorkerStarted):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _no_worker(inner)
            if found is not None:
                return found
    return None


async def _drive(job: RunJob, out: Output, signals: LoopSignals, outcome: _Outcome) -> None:
    """Open the agent, send the prompt (or wake), wait until idle, and take it all down."""
    import andon
    from andon.hooks import TurnBudget

    s = job.settings
    hooks = []
    if s.turn_budget is not None or s.max_steps is not None:
        hooks.append(TurnBudget(seconds=s.turn_budget, steps=s.max_steps))
    # Asked here, on the loop, so that a signal during the (bounded) question cancels it too.
    window = await context_window_for(s, job.model)
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
                context_window=window,
            ),
            hooks=hooks,
        ) as agent:
            signals.opening = None  # opened: from here a signal stops the agent, not the task
            if out.liveness is not None:
                out.liveness.ready()
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


def _watch(job: RunJob, out: Output) -> None:
    """Liveness lines for a log nobody watches live (docs/ci.md, Liveness in CI logs): from now,
    while the run starts, and for every silent tool call."""
    where = "" if job.settings.workers_in == "local" else f" ({job.settings.workers_in})"
    liveness = out.watch(job.settings.progress_interval)
    liveness.waiting_for = f"the tool workers to start{where}"
    liveness.starting()


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
