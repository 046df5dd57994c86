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
SIGPIPE (141); a final answer that did not match ``--output-schema`` after one retry is 8;
otherwise the last ``turn/end`` decides (see :func:`exit_code_for`).

Structured output (docs/ci.md, Structured output): with ``--output-schema`` the prompt carries the
schema, and once the job's last turn has completed its final text is checked
(``andon.cli._structured``); an answer that does not match gets one more turn of the same session,
whose user message (``source: "output-schema"``) names what was wrong. ``--output-last-message``
is written only when the run exits 0, so a CI step never reads a stopped turn's partial text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, assert_never

from andon.base import Disposed, Hook, NoWorkerStarted, describe_error
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
from andon.cli._structured import (
    Answer,
    Mismatch,
    OutputSchema,
    check_answer,
    instructions,
    retry_message,
    write_atomically,
)
from andon.llm import Model
from andon.session import (
    AgentEvent,
    AssistantMessage,
    Blocked,
    Completed,
    Interrupted,
    MaxTokens,
    Record,
    TurnAborted,
    TurnEnd,
    TurnEndReason,
    TurnFailed,
    TurnStart,
)

if TYPE_CHECKING:
    from andon.supervisor import Agent, FoundInstructions

__all__ = ["RunJob", "exit_code_for", "last_turn_overflowed", "run_job"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_BLOCKED: Final = 3
EXIT_MAX_TOKENS: Final = 4
EXIT_HOOK: Final = 5
EXIT_NO_WORKER: Final = 6  # no tool worker could be started (docs/ci.md, Exit codes)
EXIT_TOO_LONG: Final = 7  # the request does not fit the context window, even compacted
EXIT_OUTPUT_MISMATCH: Final = 8  # the final answer did not match --output-schema after a retry
EXIT_EPIPE: Final = 128 + signal.SIGPIPE


def exit_code_for(reason: TurnEndReason | None) -> int:
    """The exit code a run without signals gets from its last ``turn/end`` reason."""
    match reason:
        case None | Completed():
            return EXIT_OK
        case Blocked():
            return EXIT_BLOCKED
        case MaxTokens():
            return EXIT_MAX_TOKENS
        case TurnAborted(cause=Hook()):
            return EXIT_HOOK
        case TurnFailed(code="CONTEXT_OVERFLOW"):
            return EXIT_TOO_LONG
        case TurnAborted() | TurnFailed() | Interrupted():
            return EXIT_FAILED
        case _:
            assert_never(reason)


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
    output_schema: OutputSchema | None = None  # --output-schema, read and checked
    output_file: Path | None = None  # --output-last-message, its folder checked writable
    instructions: FoundInstructions | None = None  # AGENTS.md files (None: turned off)
    overflowed: bool = False  # the resumed session's last turn did not fit the window


def run_job(job: RunJob) -> int:
    """Run ``job`` on a fresh event loop and return the exit code."""
    from andon.fleet import ForkserverLauncher

    # The process exits once the job is over (andon.cli._leave): the forkserver is killed then,
    # not waited for (docs/benchmarks.md, The exit figure).
    ForkserverLauncher.leaving()
    # The loop hands its signals to the recording handler when it closes (HoldingLoop): from
    # here to the process's exit, a signal never acts by its default action.
    with asyncio.Runner(loop_factory=HoldingLoop) as runner:
        code = runner.run(_run(job))
    # The session's trace, from its closed log, when an OTLP endpoint is set (docs/traces.md):
    # bounded, and a failure is one warning line; the exit code stays the run's.
    from andon.cli._traces import export_after_run

    export_after_run(job.session)
    return code


async def _run(job: RunJob) -> int:
    loop = asyncio.get_running_loop()
    install_log_handler()
    out = _output(job)
    signals = LoopSignals(out, job.session)
    signals.install(loop)  # first, before anything else starts
    return await _run_installed(job, out, signals)


async def _run_installed(job: RunJob, out: Output, signals: LoopSignals) -> int:
    live = out.start_live()
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
            say(f"stopping after {signal.Signals(signals.first).name}: {describe_error(e)}")
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
    elif outcome.mismatch is not None:
        code = EXIT_OUTPUT_MISMATCH
    else:
        code = exit_code_for(out.tracker.last_end)
    if outcome.mismatch is not None and code == EXIT_OUTPUT_MISMATCH:
        say(outcome.mismatch)
    if code == EXIT_OK and job.output_file is not None and outcome.final_text is not None:
        code = _write_output(job.output_file, outcome)
    ended = out.tracker.last_end
    if isinstance(ended, TurnFailed) and not job.json:
        say(f"the turn failed: {ended.code}: {ended.message}")
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
    ended = out.tracker.last_end
    summary["ended"] = None if ended is None else ended.to_json()
    if outcome.failure is not None:
        summary["failure"] = outcome.failure
    elif outcome.mismatch is not None and code == EXIT_OUTPUT_MISMATCH:
        summary["failure"] = outcome.mismatch
    if outcome.answer is not None:
        summary["output"] = outcome.answer.value
    return summary


def _write_output(target: Path, outcome: _Outcome) -> int:
    """Write ``--output-last-message``; a failure is one line and exit 1 (the answer is in the
    log and in ``run/summary`` all the same)."""
    assert outcome.final_text is not None
    try:
        text = outcome.final_text
        write_atomically(target, text if text.endswith("\n") else text + "\n")
    except OSError as e:
        outcome.failure = f"cannot write --output-last-message {target}: {e.strerror or e}"
        say(outcome.failure)
        return EXIT_FAILED
    return EXIT_OK


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
    final_text: str | None = None  # the last turn's answer, if it completed (and matched)
    answer: Answer | None = None  # --output-schema: the answer that matched
    mismatch: str | None = None  # --output-schema: why the answer did not match (exit 8)


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
    from andon.hooks import TurnBudget
    from andon.supervisor import open_agent

    s = job.settings
    hooks = []
    if s.turn_budget is not None or s.max_steps is not None:
        hooks.append(TurnBudget(seconds=s.turn_budget, steps=s.max_steps))
    # Asked here, on the loop, so that a signal during the (bounded) question cancels it too.
    window = await context_window_for(s, job.model)
    # A SessionLive or ConfigError raised while opening leaves here wrapped in an exception
    # group; ``andon.cli.main`` reports it as one line with exit code 2.
    async with asyncio.TaskGroup() as tg:  # noqa: SIM117 (the view outlives the agent)
        async with open_agent(
            job.session,
            **agent_options(
                job.settings,
                model=job.model,
                cwd=job.cwd,
                system_prompt=job.system_prompt,
                session_id=job.session_id,
                instructions=job.instructions,
                context_window=window,
            ),
            hooks=hooks,
        ) as agent:
            signals.opening = None  # opened: from here a signal stops the agent, not the task
            if out.liveness is not None:
                out.liveness.ready()
            outcome.session_id = agent.session_id
            events = agent.events(since_seq=job.since_seq)
            tg.create_task(_show_events(events, out, agent))
            # A reader that went away disposes the agent at once, not at the next event.
            out.on_closed(lambda: agent.cancel(Disposed()))
            if signals.first is None and job.overflowed:
                signals.agent = agent
                await _compact_first(agent)
            if signals.first is None:  # a signal during the pool's start: no turn at all
                signals.agent = agent
                schema = job.output_schema
                if job.prompt is not None:
                    wanted = "" if schema is None else f"\n\n---\n{instructions(schema)}"
                    agent.followup(job.prompt + wanted)
                else:
                    # Resume without a prompt: the inbox holds work (checked before the loop).
                    agent.wake()
                    if schema is not None:  # its messages are logged: the request is a turn
                        agent.followup(instructions(schema), source="output-schema")
                wants_answer = schema is not None or job.output_file is not None
                if await _idle(agent, outcome) and wants_answer:  # else: no log read at the end
                    await _conclude(job, agent, out, signals, outcome)
            outcome.usage = dict(agent.usage)


def last_turn_overflowed(records: Sequence[Record]) -> bool:
    """Whether the log's last turn ended because a request did not fit the window (an open turn
    after it, which crash repair closes as interrupted, means no)."""
    for record in reversed(records):
        if isinstance(record.data, TurnStart):
            return False
        if isinstance(record.data, TurnEnd):
            reason = record.data.reason
            return isinstance(reason, TurnFailed) and reason.code == "CONTEXT_OVERFLOW"
    return False


async def _compact_first(agent: Agent) -> None:
    """A session whose last turn overflowed is compacted before it goes on (docs/agent-loop.md,
    Compaction); if that fails, the turn's own overflow handling is what is left."""
    from andon.base import Aborted, ModelError

    # A signal is handled by the caller; a model failure shows again in the turn that follows.
    with contextlib.suppress(ModelError, Aborted):
        await agent.compact(force=True)


async def _idle(agent: Agent, outcome: _Outcome) -> bool:
    """Wait until the agent is idle; False (and the failure noted) if its log failed."""
    try:
        await agent.when_idle()
    except Exception as e:  # a log write failure: the agent stopped
        outcome.failure = f"{type(e).__name__}: {e}"
        return False
    return True


async def _conclude(
    job: RunJob, agent: Agent, out: Output, signals: LoopSignals, outcome: _Outcome
) -> None:
    """The job's answer: the final text of its last turn, if that turn completed; with
    ``--output-schema``, checked, and asked for once more if it does not match."""
    text = _completed_answer(job, agent)
    if text is None or job.output_schema is None:
        outcome.final_text = text
        return
    checked = check_answer(job.output_schema, text)
    if isinstance(checked, Mismatch) and signals.first is None and not out.closed:
        agent.followup(retry_message(checked.problem), source="output-schema")
        if not await _idle(agent, outcome):
            return
        text = _completed_answer(job, agent)
        if text is None:  # the retry turn was stopped or failed: its turn/end decides
            return
        checked = check_answer(job.output_schema, text)
    if isinstance(checked, Answer):
        outcome.answer, outcome.final_text = checked, checked.text
    else:
        outcome.mismatch = (
            f"the final answer did not match --output-schema {job.output_schema.path} after one "
            f"retry: {checked.problem}"
        )


def _completed_answer(job: RunJob, agent: Agent) -> str | None:
    """The text of the last turn's final ``assistant/message`` (its text blocks joined), read
    from the log (written synchronously, so complete once the agent is idle); None unless that
    turn completed."""
    ended: TurnEnd | None = None
    texts: dict[int, str] = {}  # turn -> the text of its last assistant/message
    for record in agent.records_from(job.since_seq):  # this run's: not a resumed log's all
        match record.data:
            case TurnEnd() as end:
                ended = end
            case AssistantMessage(turn=turn, message=message):
                texts[turn] = message.text
            case _:
                pass
    if ended is None or not isinstance(ended.reason, Completed):
        return None
    return texts.get(ended.turn, "")


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


async def _show_events(events: AsyncIterator[AgentEvent], out: Output, agent: Agent) -> None:
    """Show every event; on a closed stdout, dispose the agent quietly and keep draining."""
    async for event in events:
        try:
            out.feed(event)
        except StdoutClosed:
            agent.cancel(Disposed())
