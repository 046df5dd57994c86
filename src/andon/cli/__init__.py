"""The ``andon`` command: :func:`main`, its entry point, handles signals before anything else is
imported.

An internal face: the command line (flags, exit codes, ``--json`` lines) is the promise, not these
modules (docs/architecture.md, Who the names are for).

The parser and the commands (``andon.cli._main``) import asyncio and the base layer (~60 ms); a
CI runner's signal in that window would otherwise kill the process by the default action. So this
package's ``__init__`` imports only the light ``andon.cli._signals`` and installs the handlers at
once, which leaves just the interpreter's own start-up out of reach; everything else is imported
inside :func:`main`.

The modules: ``_main`` (the parser, every user mistake checked before the agent starts), ``_run``
(``andon run`` / ``resume``: the job and its exit code), ``_signals`` (the signal ledger and the
early phase), ``_ladder`` (what a signal does while the loop runs), ``_setup`` (the model and the
agent options), ``_sessions`` (where sessions live), ``_output`` and ``_term`` (what is printed,
plain and on a terminal), ``_liveness`` (lines that say a silent run is alive), ``_settings``
(flags, ``ANDON_*``, ``andon.toml``), ``_prices``, ``_workers`` (``--workers-in``), ``_chat``,
``bench`` (``andon bench``), and ``_worker`` (``andon worker``, entered without ``_main``).

The process also *leaves* from here: once the exit code is decided and stdout and stderr are
flushed, ``os._exit``. Interpreter finalization restores the default action of every signal
Python handles (a late SIGTERM would then kill the process and change its status after
``run/summary`` said otherwise) and tears down modules for nothing: everything andon started is
already gone (the pool checked), so there is nothing left for it to do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from andon.cli import _signals

__all__ = ["main"]

_signals.install_early()
_STARTED = time.monotonic()


def main() -> int:
    _without_httpx_cli()
    try:
        try:
            _prestart_forkserver(sys.argv[1:])
            if sys.argv[1:2] == ["worker"]:
                # A container's or a host's worker: the worker side only, not the whole command
                # (andon.cli._worker).
                from andon.cli._worker import main as cli_main
            else:
                from andon.cli._main import main as cli_main

            code = cli_main()
            if _signals.LEDGER.lost_stop and _signals.LEDGER.first is not None:
                # The early stop was raised where Python could only print it (andon.cli._signals,
                # _quiet_stops) and the command went on: the first signal decides all the same.
                # (A signal after the command decided its code is only recorded, as always.)
                code = 128 + _signals.LEDGER.first
        finally:
            # On the way out a signal is only recorded: the code is decided.
            _signals.LEDGER.early = False
    except BaseException as e:
        # A signal before anything started (while the command is imported, or its arguments,
        # settings and model are read): no process, no session folder.
        stop = _signals.stopped_in(e)
        if stop is None:
            raise
        code = 128 + stop.signum
        with contextlib.suppress(Exception):
            name = signal.Signals(stop.signum).name
            print(f"andon: {name}: stopped before anything started", file=sys.stderr)
        if _json_run(sys.argv[1:]):
            with contextlib.suppress(Exception):
                _early_summary(code)
    _leave(code)
    return code  # not reached


def _without_httpx_cli() -> None:
    """httpx's ``__init__`` imports its own command line (``httpx._main``: click, rich, pygments)
    when those are installed, about two thirds of what importing httpx costs, and andon never
    calls it. A ``None`` in ``sys.modules`` makes that import fail, which httpx expects (it then
    defines a ``main`` that says its CLI extras are missing). Only in andon's own process, and only
    before httpx is imported: a program that imports andon as a library is left as it is."""
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def _prestart_forkserver(argv: list[str]) -> None:
    """``andon run`` and ``andon resume`` start the workers' forkserver first thing, so that its
    interpreter starts and imports the worker side while this one imports the command and parses
    it: both take about as long, and the first tool waits for the sum otherwise (docs/workers.md,
    Starting workers). Without the model key variables, as always; a pool that needs more hidden
    replaces it. Not for help, nor where workers run elsewhere (``--workers-in``,
    ``ANDON_WORKERS_IN``: an ``andon.toml`` that says so costs one unused forkserver, stopped at
    the exit). A failure here is nobody's business: the pool starts one itself."""
    words = _run_words(argv)
    if words is None:
        return
    if {"-h", "--help"} & set(words) or any(w.startswith("--workers-in") for w in words):
        return
    if os.environ.get("ANDON_WORKERS_IN", "local").strip() not in ("", "local"):
        return
    with contextlib.suppress(Exception):
        from andon.base import API_KEY_ENV_VARS
        from andon.fleet import ForkserverLauncher

        ForkserverLauncher.prestart(API_KEY_ENV_VARS)


def _leave(code: int) -> None:
    # A forkserver started ahead that no pool took (the command ended early) goes first.
    fleet = sys.modules.get("andon.fleet")
    if fleet is not None:
        with contextlib.suppress(Exception):
            fleet.ForkserverLauncher.stop_unused()
    # What the output's writer threads still hold (the last stderr lines, say) goes out first,
    # within their own bounds: os._exit runs no atexit hook.
    writer = sys.modules.get("andon.cli._writer")
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.drain_writers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to save
            stream.flush()
    os._exit(code)


def _run_words(argv: list[str]) -> list[str] | None:
    """The words of ``argv`` before any ``--`` if it is ``andon run`` or ``andon resume``, else
    None: read by hand, as the parser may not exist yet (the subcommand is the first word that
    is no option)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    commands = [w for w in words if not w.startswith("-")]
    return words if commands and commands[0] in ("run", "resume") else None


def _json_run(argv: list[str]) -> bool:
    """Whether ``argv`` is ``andon run --json`` or ``andon resume --json``."""
    words = _run_words(argv)
    return words is not None and "--json" in words


def _early_summary(code: int) -> None:
    """The ``run/summary`` of a run stopped before its session existed: a CI step reading
    ``--json`` gets its last line whatever the moment (no session, nothing ran)."""
    import json

    summary = {
        "type": "run/summary",
        "session": None,
        "session_id": None,
        "exit_code": code,
        "turns": 0,
        "tool_calls": 0,
        "duration": round(time.monotonic() - _STARTED, 3),
        "final_text": None,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_prompt_tokens": 0},
        "ended": None,
    }
    sys.stdout.write(json.dumps(summary) + "\n")
