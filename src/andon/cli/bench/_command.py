"""The ``bench`` subcommand: its arguments, the checks of them, the kinds it runs and the tables
it prints (the measurements are in the sibling modules)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

from andon.base import GracePolicy

from ._stats import ms, table

__all__ = ["register", "run"]

KINDS = ("interrupt", "exit", "startup", "dispatch", "recovery", "context", "all")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench", help="benchmarks, each beside its floor: a table and optionally a PNG plot"
    )
    p.add_argument("kind", nargs="?", default="interrupt", choices=KINDS)
    p.add_argument("--runs", type=int, default=30, help="runs per scenario (default 30)")
    p.add_argument("--scenario", action="append", default=None, metavar="NAME", help="repeatable")
    p.add_argument("--grace", default="0.2,0.3", help="TERM,KILL seconds (default 0.2,0.3)")
    p.add_argument("--seed", type=int, default=1, help="seed of the cancel-moment RNG")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--plot", metavar="FILE.png", help="latency distribution per scenario")
    p.add_argument("--max-events", type=int, default=1_000_000, help="recovery: largest log")
    p.add_argument(
        "--steps", type=int, default=200, help="context: bash steps of the job (default 200)"
    )
    p.add_argument(
        "--output-bytes",
        type=int,
        default=8192,
        help="context: bytes each step prints (default 8192)",
    )
    p.add_argument(
        "--window", type=int, default=16000, help="context: the window in tokens (default 16000)"
    )
    p.add_argument(
        "--remote",
        choices=("auto", "off"),
        default="auto",
        help="dispatch, interrupt: add tcp + CURVE and container worker rows (default auto: "
        "containers where an engine can be used)",
    )
    p.add_argument("--engine", metavar="URL", help="the container engine for those rows")
    p.add_argument("--image", metavar="IMAGE", help="with --engine: an image with andon in it")
    p.set_defaults(command="bench")
    return p


PLAIN_EVERY: Final = 10.0
"""Seconds between two plain progress lines of one measurement (its first and last always
show)."""


class Progress:
    """What ``andon bench`` is measuring, on stderr.

    On a terminal, a bar redrawn in place. On a pipe or a file (a CI log), plain lines: the first
    and the last run of each measurement and at most one line every ``every`` seconds between
    them, never a carriage return or an escape code, so a long benchmark shows it is alive
    without filling the log."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        every: float = PLAIN_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self.every = every
        self.kind = ""  # the benchmark under way: interrupt, exit, dispatch, recovery
        self._clock = clock
        self._name: str | None = None
        self._said = -math.inf

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def __call__(self, name: str, i: int, n: int) -> None:
        """Run ``i`` (from 0) of ``n`` of the measurement ``name`` begins."""
        if _is_terminal(self.stream):
            width = 20
            done = width * (i + 1) // n
            bar = "#" * done + "." * (width - done)
            self.stream.write(f"\r\033[K{name:<16} [{bar}] {i + 1}/{n}")
            self.stream.flush()
            return
        now = self._clock()
        new = name != self._name
        if not (new or i + 1 == n or now - self._said >= self.every):
            return
        self._name, self._said = name, now
        what = name if name.startswith(self.kind) else f"{self.kind}: {name}"
        self.stream.write(f"andon bench: {what}: {i + 1} of {n}\n")
        self.stream.flush()

    def end(self) -> None:
        """The measurement is over: clear the bar (a plain log keeps its lines)."""
        if _is_terminal(self.stream):
            self.stream.write("\r\033[K")
            self.stream.flush()
        self._name = None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    """Run ``andon bench`` as parsed by the parser ``register`` built; returns the exit code."""
    from andon.cli._output import install_log_handler

    from ._interrupt import SCENARIOS

    # The library's warnings (a worker lost or killed, a refused handshake ...) come out as every
    # other command's do, "andon: ..." lines, not bare through Python's last-resort handler.
    install_log_handler()
    try:
        grace = GracePolicy.parse(args.grace)
    except ValueError as e:
        print(f"andon bench: {e}", file=sys.stderr)
        return 2
    if args.runs < 1:
        print("andon bench: --runs must be at least 1", file=sys.stderr)
        return 2
    names = args.scenario or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(
            f"andon bench: unknown scenario {unknown[0]!r} (one of {', '.join(SCENARIOS)})",
            file=sys.stderr,
        )
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("andon bench: --plot needs matplotlib: pip install andon[plot]", file=sys.stderr)
            return 2
    problem = _context_problem(args)
    if problem is not None:
        print(f"andon bench: {problem}", file=sys.stderr)
        return 2
    every = ["interrupt", "exit", "startup", "dispatch", "recovery", "context"]
    kinds = every if args.kind == "all" else [args.kind]
    if (args.engine is None) != (args.image is None):
        print("andon bench: --engine and --image go together", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        engine: Any = "off (--remote off)"
        if args.remote != "off" and {"interrupt", "dispatch"} & set(kinds):
            from ._remote import engine_for_bench

            engine = stack.enter_context(engine_for_bench(args.engine, args.image))
        return _run_kinds(args, kinds, names, grace, engine)


def _run_kinds(
    args: argparse.Namespace, kinds: list[str], names: list[str], grace: GracePolicy, engine: Any
) -> int:
    out: dict[str, Any] = {}
    code = 0
    texts = []
    progress = Progress()
    for kind in kinds:
        progress.kind = kind
        if kind == "interrupt":
            data, text, bad = _interrupt_report(args, names, grace, progress)
            code = max(code, 1 if bad else 0)
            if args.remote != "off":
                from ._remote import remote_interrupt_rows

                rows, notes = asyncio.run(remote_interrupt_rows(args.runs, grace, engine, progress))
                data["remote"] = rows
                text += "\n\n" + _remote_table(
                    "cancel -> result by where the worker runs", rows, notes
                )
        elif kind == "exit":
            from ._exit import run_exit

            data, text, bad = run_exit(args.runs, args.grace, args.seed, progress)
            code = max(code, 1 if bad else 0)
        elif kind == "startup":
            from ._startup import run_startup

            data, text, bad = run_startup(args.runs, progress)
            code = max(code, 1 if bad else 0)
        elif kind == "dispatch":
            from ._dispatch import run_dispatch

            data, text = asyncio.run(run_dispatch(args.runs, progress))
            if args.remote != "off":
                from ._remote import remote_dispatch_rows

                rows, notes = asyncio.run(remote_dispatch_rows(args.runs, engine, progress))
                data["remote"] = rows
                text += "\n\n" + _remote_table("dispatch by where the worker runs", rows, notes)
        elif kind == "context":
            from ._context import run_context

            data, text, failed = run_context(args.steps, args.output_bytes, args.window, progress)
            if failed is not None:
                progress.end()
                print(f"andon bench: {failed}", file=sys.stderr)
                code = max(code, 1)
        else:
            from ._recovery import run_recovery

            data, text = run_recovery(args.max_events, progress)
        progress.end()
        out[kind] = data
        texts.append(text)
    if args.json:
        print(json.dumps(out if len(kinds) > 1 else out[kinds[0]], indent=2))
    else:
        print("\n\n".join(texts))
    if args.plot and "interrupt" in out:
        from ._plot import plot

        plot(out["interrupt"], args.plot)
        print(f"andon: plot: {args.plot}", file=sys.stderr)
    return code


def _context_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``context`` flags, or None (checked whatever the kind: a bad value
    is a mistake even where it is not used)."""
    from ._context import MAX_OUTPUT_BYTES, MIN_WINDOW

    if args.steps < 1:
        return f"--steps must be at least 1, got {args.steps}"
    if not 1 <= args.output_bytes <= MAX_OUTPUT_BYTES:
        return f"--output-bytes must be 1 to {MAX_OUTPUT_BYTES:,}, got {args.output_bytes}"
    if args.window < MIN_WINDOW:
        return (
            f"--window must be at least {MIN_WINDOW} tokens (the system prompt and the tools "
            f"alone take about 650), got {args.window}"
        )
    return None


def _remote_table(title: str, rows: dict[str, Any], notes: list[str]) -> str:
    body = table(
        ["path", "p50", "p95", "p99", "max"],
        [[k, ms(s["p50"]), ms(s["p95"]), ms(s["p99"]), ms(s["max"])] for k, s in rows.items()],
    )
    return "\n".join([f"{title} (ms); each beside its floor", body, *notes])


def _interrupt_report(
    args: argparse.Namespace, names: list[str], grace: GracePolicy, progress: Progress
) -> tuple[dict[str, Any], str, bool]:
    from ._interrupt import run_interrupt

    results, containment = asyncio.run(run_interrupt(names, args.runs, grace, args.seed, progress))
    data: dict[str, Any] = {
        "runs": args.runs,
        "grace": grace.to_dict(),
        "seed": args.seed,
        "containment": containment,
        "scenarios": {name: r.to_json() for name, r in results.items()},
    }
    rows = []
    bad = False
    for name, r in results.items():
        j = data["scenarios"][name]
        lat = j["latency"]
        floor = j.get("floor")
        if not r.reference and (j["survivors_max"] or j["bytes_after_max"]):
            bad = True
        rows.append(
            [
                name + (" (ref)" if r.reference else ""),
                ",".join(f"{k}×{v}" for k, v in sorted(j["ended_by"].items())),
                ms(lat["p50"]),
                ms(lat["p95"]),
                ms(lat["p99"]),
                ms(lat["max"]),
                ms(j["cpu"]["p50"] if "cpu" in j else None),
                ms(floor["p50"] if floor else None),
                ms(floor["p99"] if floor else None),
                ms(j["overhead_p50"]),
                ms(j["overhead_p99"]),
                j["survivors_max"],
                j["bytes_after_max"],
                j.get("floor_leaves_max", "—"),
            ]
        )
        if "floor_everything" in j:
            every = j["floor_everything"]
            rows.append(
                [
                    f"{name} vs stop-all",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    ms(every["p50"]),
                    ms(every["p99"]),
                    ms(j["overhead_everything_p50"]),
                    ms(j["overhead_everything_p99"]),
                    "",
                    "",
                    0,
                ]
            )
    headers = [
        "scenario",
        "ended by",
        "p50",
        "p95",
        "p99",
        "max",
        "CPU p50",
        "floor p50",
        "floor p99",
        "+p50",
        "+p99",
        "survivors",
        "bytes after",
        "floor leaves",
    ]
    text = (
        f"cancel -> durable turn/end (ms); {args.runs} runs per scenario; grace "
        f"{grace.term_after},{grace.kill_after}; containment {containment}; seed {args.seed}\n"
        "+p50/+p99: beyond the floor where there is one, else beyond the start of the grace "
        "stage that ended the call; CPU: andon's process and its workers (every thread), cancel "
        "-> turn/end; survivors and bytes after: max over runs, 100 ms after turn/end\n"
        + table(headers, rows)
    )
    return data, text, bad
