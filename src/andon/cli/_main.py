"""The ``andon`` command.

Every user mistake becomes one clear line on stderr and exit code 2; a traceback is shown only with
``--debug``. Commands that exist in the design but are not built yet are not offered here.

``andon run`` / ``andon resume`` live in ``andon.cli._run`` (the job and its exit code),
``andon.cli._signals`` and ``andon.cli._ladder`` (signals before and during the loop),
``andon.cli._output`` (what is printed), ``andon.cli._settings`` (flags, ``ANDON_*``,
``andon.toml``), ``andon.cli._setup`` (what a resumed session's log says, the model, the agent
options) and ``andon.cli._sessions`` (where sessions live); this module parses arguments and checks
everything a user can get wrong before the agent starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from andon import __version__
from andon.base import (
    AndonError,
    ConfigError,
    LogCorrupted,
    LogFormatUnsupported,
    SessionLive,
    clean_text,
    describe_error,
)
from andon.cli._parser import EXIT_USAGE
from andon.cli._parser import Parser as _Parser

if TYPE_CHECKING:
    from andon.cli._run import RunJob
    from andon.session import InvariantViolation, Record, TornTail

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="andon", description="Supervise LLM agent loops; stop them cleanly.")
    parser.add_argument("--version", action="version", version=f"andon {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    source = "a session folder, a session id, or a log file (read as it is; the saved output of "
    source += "'andon run --json' too)"
    log = sub.add_parser("log", help="show a session's transcript")
    log.add_argument("session", metavar="DIR|FILE", help=source)
    log.add_argument("--json", action="store_true", help="one JSON record per line")

    check = sub.add_parser("check", help="check a session log's invariants")
    check.add_argument("session", metavar="DIR|FILE", help=source)

    repair = sub.add_parser("repair", help="repair a session whose last run crashed")
    repair.add_argument("session", metavar="DIR")
    repair.add_argument("--dry-run", action="store_true", help="say what would be appended")

    trace = sub.add_parser("trace", help="send a session's log as an OpenTelemetry trace (OTLP)")
    trace.add_argument("session", metavar="DIR")

    sessions = sub.add_parser("sessions", help="list the sessions under the sessions root")
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")

    run = sub.add_parser("run", help="run one job: a prompt until the agent is idle")
    run.add_argument("prompt", nargs="?", metavar="PROMPT", help="the task (default: stdin)")
    run.add_argument("--session", metavar="DIR", help="session folder (an existing one is resumed)")
    _job_options(run)

    resume = sub.add_parser("resume", help="continue a session (repairing it if it crashed)")
    resume.add_argument("session", metavar="DIR", help="a session folder, or a session id")
    resume.add_argument("prompt", nargs="?", metavar="PROMPT", help="a follow-up to run")
    _job_options(resume)

    from andon.cli._chat import register as register_chat

    register_chat(sub)

    from andon.cli.bench import register as register_bench

    register_bench(sub)

    from andon.cli import _worker

    _worker.add_arguments(sub.add_parser("worker", help=_worker.HELP))

    keys = sub.add_parser("keys", help="CURVE keys for tool workers on other hosts")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", parser_class=_Parser)
    keys_sub.required = True
    generate = keys_sub.add_parser(
        "generate", help="write NAME.key (public) and NAME.key_secret (secret, 0600) in FOLDER"
    )
    generate.add_argument("folder", metavar="FOLDER")
    generate.add_argument("--name", default="worker", help="file name stem (default: worker)")

    completion = sub.add_parser(
        "completion", help="print a shell completion script (bash, zsh or fish)"
    )
    completion.add_argument("shell", choices=("bash", "zsh", "fish"))

    mock = sub.add_parser("mock-model", help="serve a scripted OpenAI-compatible model")
    mock.add_argument("--script", required=True, metavar="FILE", help="YAML or JSON replies")
    mock.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    mock.add_argument(
        "--strict-reasoning",
        action="store_true",
        help="answer HTTP 400 as DeepSeek V4 does when a tool-using span's reasoning is missing",
    )
    mock.add_argument(
        "--context-window", metavar="N", help="refuse requests over N tokens (JSON bytes / 4)"
    )
    mock.add_argument(
        "--overflow-shape",
        metavar="SHAPE",
        help="how: openai (default), deepseek, vllm, llamacpp, llama-cpp-python, empty-stream",
    )
    return parser


def _job_options(p: argparse.ArgumentParser) -> None:
    """Options shared by run and resume."""
    from andon.cli._settings import add_agent_options

    add_agent_options(p, job=True)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line. ``andon resume DIR --model X "PROMPT"``: argparse takes the positionals
    that stand together at once, so a prompt after the options would be "unrecognized"; it is
    taken as the prompt here, as it is after ``andon run``'s options."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if (
        args.command == "resume"
        and args.prompt is None
        and len(extra) == 1
        and not extra[0].startswith("-")
    ):
        args.prompt = extra[0]
        extra = []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The ``andon`` command. Its entry point (``andon.cli``) handles signals from before this
    module is imported, turns a signal that arrives before anything started into its exit code,
    and leaves the process."""
    args = _parse(argv)
    try:
        return _dispatch(args)
    except BaseExceptionGroup as group:
        # A task group (andon run) wraps what failed inside it; report the first failure.
        if args.debug or len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
        if not isinstance(error, AndonError | OSError):
            raise
        print(f"andon: {describe_error(error, typed=False)}", file=sys.stderr)
        return EXIT_USAGE if _is_usage(error) else EXIT_FAILED
    except BrokenPipeError:
        # `andon log DIR | head` closed our stdout: not an error worth a word. (Before OSError,
        # of which it is a subclass.)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (AndonError, OSError) as e:
        if args.debug:
            raise
        print(f"andon: {describe_error(e, typed=False)}", file=sys.stderr)
        return EXIT_USAGE if _is_usage(e) else EXIT_FAILED
    except KeyboardInterrupt:
        # Ctrl-C before `andon run` installed its own handlers: nothing had started yet.
        if args.debug:
            raise
        print("andon: interrupted", file=sys.stderr)
        return 128 + 2


def _is_usage(error: BaseException) -> bool:
    return isinstance(error, SessionLive | ConfigError | FileNotFoundError | NotADirectoryError)


def _session_dir(value: str) -> Path:
    """A session folder given as a path, or as a session id (a folder under the sessions root)."""
    from andon.cli._sessions import sessions_root

    path = Path(value)
    if not path.is_dir() and value and os.sep not in value and value not in (".", ".."):
        try:
            by_id: Path | None = sessions_root() / value
        except ConfigError:
            by_id = None  # no sessions root (HOME unset): the value can only be a path
        if by_id is not None and by_id.is_dir():
            path = by_id
    if not path.is_dir():
        raise NotADirectoryError(2, "no such session folder (nor a session id)", value)
    if not (path / "events.jsonl").exists():
        raise FileNotFoundError(2, "not a session folder (no events.jsonl)", value)
    return path


def _log_source(value: str) -> Path:
    """What ``log`` and ``check`` read: a regular file as it is (an ``events.jsonl``, or saved
    ``andon run --json`` output, whose live-only lines the reader skips), else a session folder
    or id. A file is only ever read: never locked, never repaired."""
    path = Path(value)
    if path.is_file():
        return path
    try:
        return _session_dir(value)
    except NotADirectoryError:
        if path.exists():
            raise
        raise FileNotFoundError(2, "no such file, session folder or session id", value) from None


def _check_new_session(path: Path) -> None:
    """``--session DIR`` for a new session: andon creates DIR, never the folders above it."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--session: {path} exists and is not a folder")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ConfigError(
            f"--session: the folder {parent} does not exist; create it first (andon creates only "
            "the session folder itself)"
        )


def _dispatch(args: argparse.Namespace) -> int:
    match args.command:
        case "log":
            return _log(_log_source(args.session), as_json=args.json)
        case "check":
            return _check(_log_source(args.session))
        case "repair":
            return _repair(_session_dir(args.session), dry_run=args.dry_run)
        case "trace":
            from andon.cli._traces import trace_command

            return trace_command(_session_dir(args.session))
        case "sessions":
            from andon.cli._sessions import sessions_root

            return _sessions(sessions_root(), as_json=args.json)
        case "run" | "resume":
            from andon.cli._run import run_job

            return run_job(_job(args))
        case "bench":
            from andon.cli.bench import run as run_bench

            return run_bench(args)
        case "chat":
            from andon.cli._chat import run as run_chat

            return run_chat(args)
        case "worker":
            from andon.cli._worker import run as run_worker

            return run_worker(args)
        case "keys":
            return _keys(args)
        case "completion":
            from andon.cli._completion import completion_script

            sys.stdout.write(completion_script(args.shell, _parser()))
            return EXIT_OK
        case "mock-model":
            from andon.testing import mock_model_main

            argv = ["--script", args.script, "--port", str(args.port)]
            if args.strict_reasoning:
                argv.append("--strict-reasoning")
            if args.context_window is not None:
                argv += ["--context-window", args.context_window]
            if args.overflow_shape is not None:
                argv += ["--overflow-shape", args.overflow_shape]
            return mock_model_main(argv)
    raise AssertionError(f"unhandled command {args.command!r}")


def _keys(args: argparse.Namespace) -> int:
    from andon.protocol import load_public_keys, write_keys

    public, secret = write_keys(Path(args.folder), args.name)
    (key,) = load_public_keys(public)
    print(f"public key: {public} ({key.decode('ascii')})")
    print(f"secret key: {secret} (keep it on the worker's host only; mode 0600)")
    return EXIT_OK


def _job(args: argparse.Namespace) -> RunJob:
    """Everything ``run``/``resume`` needs, checked before any process starts (errors exit 2)."""
    from andon.cli._run import RunJob
    from andon.cli._sessions import new_session_dir
    from andon.cli._settings import resolve
    from andon.cli._setup import job_base, read_existing, refuse_invalid
    from andon.cli._structured import SchemaModel, check_output_file, load_output_schema
    from andon.cli._workers import check_workers_in

    settings = resolve(vars(args))
    # The output flags are checked first: a schema or a file that cannot work spends no model
    # money and creates no session folder.
    output_schema = None if args.output_schema is None else load_output_schema(args.output_schema)
    output_file = None
    if args.output_last_message is not None:
        output_file = check_output_file(args.output_last_message)
    folder: Path | None = None
    if args.command == "resume":
        folder = _session_dir(args.session)
    elif args.session is not None and Path(args.session, "events.jsonl").exists():
        folder = Path(args.session)
    elif args.session is not None:
        _check_new_session(Path(args.session))
    existing = None if folder is None else read_existing(folder)
    if existing is not None:
        refuse_invalid(existing)
        state = existing.state
        if args.prompt is None and not (state.next_turn or state.next_step):
            repaired = _repair_on_load(existing.folder)
            raise ConfigError(
                f"nothing to run: the inbox of {existing.folder} is empty; give a PROMPT"
                + (" (the log was repaired: its interrupted turn is closed)" if repaired else "")
            )
    base = job_base(settings, existing)
    model = base.model
    if output_schema is not None:
        model = SchemaModel(model, output_schema.response_schema)
    # Outside text: argv holds invalid bytes as surrogate escapes, stdin is read as bytes.
    prompt = None if args.prompt is None else clean_text(args.prompt)
    if prompt is None and args.command == "run":
        prompt = _read_stdin()
    if prompt is not None and not prompt.strip():
        raise ConfigError("the prompt is empty")
    # The container engine is asked before a session folder is made: a missing engine, image
    # or runtime, or a ulimit it may not set, is one line and exit 2 (docs/scale-out.md,
    # Containers).
    check_workers_in(settings.workers_in, settings.containers, base.cwd)
    sid: str | None = None
    if existing is not None:
        session = existing.folder
    elif args.session is not None:
        session = Path(args.session)
    else:
        session = new_session_dir()
        sid = session.name  # the id its session/start records
    if existing is None:
        # The path comes first, so CI can keep the folder as an artifact whatever happens next.
        print(f"andon: session {session}", file=sys.stderr if args.json else sys.stdout, flush=True)
    return RunJob(
        session=session,
        settings=settings,
        model=model,
        prompt=prompt,
        json=args.json,
        cwd=base.cwd,
        system_prompt=base.system_prompt,
        created=existing is None,
        since_seq=base.since_seq,
        session_id=sid,
        output_schema=output_schema,
        output_file=output_file,
        instructions=base.instructions,
        overflowed=existing is not None and existing.summary.overflowed,
    )


def _repair_on_load(folder: Path) -> bool:
    """Open the session's log and close it again, writing nothing of its own: the open repairs a
    crashed log under the session lock, exactly as a resume that runs would (subagents' logs
    first, leftover processes killed). So a resume with nothing to run still leaves a log that
    ``andon check`` accepts. Whether anything was repaired."""
    from andon.session import SessionLog

    with SessionLog.open(folder) as log:
        return log.loaded.repaired


def _read_stdin() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError("no prompt: give PROMPT, or pipe it on stdin")
    try:
        # Bytes, not the locale's text: a prompt may hold any byte, and the rule that makes it
        # text is andon's (U+FFFD), not whatever the locale's decoder would raise.
        return clean_text(sys.stdin.buffer.read())
    except KeyboardInterrupt:
        raise ConfigError("interrupted while reading the prompt from stdin") from None


def _log(folder: Path, *, as_json: bool) -> int:
    try:
        return _print_log(folder, as_json=as_json)
    except (LogCorrupted, LogFormatUnsupported) as e:
        # Like check: a log that cannot be read is the user's input error (exit 2), not a failure.
        sys.stdout.flush()
        print(f"andon: cannot read the log: {e}", file=sys.stderr)
        return EXIT_USAGE


def _print_log(folder: Path, *, as_json: bool) -> int:
    from andon.session import iter_records, read, render_transcript

    if as_json:
        stream = iter_records(folder)
        for record in stream:
            sys.stdout.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return EXIT_OK
    records = read(folder)
    sys.stdout.write(render_transcript(records))
    if records.torn is not None:
        fix = "" if folder.is_file() else "; 'andon repair' sets it aside"
        print(
            f"[the log ends in an incomplete line ({records.torn.length} bytes): an append in "
            f"progress, or a crash{fix}]"
        )
    sys.stdout.flush()
    return EXIT_OK


def _check(folder: Path) -> int:
    from andon.session import live_holder

    if folder.is_file():  # an ``andon run --json`` file: as it is, no lock, no live test
        return _check_log(folder, is_file=True)
    holder = live_holder(folder)
    if holder is not None:
        # Its open turn is simply still running: not a violation, and nothing to repair.
        print(
            f"andon: session {folder} is live: {holder.describe()} holds its lock; check it "
            "once that process has ended",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return _check_log(folder, is_file=False)


def _check_log(path: Path, *, is_file: bool) -> int:
    """Read a session's log (or an ``andon run --json`` file) and report its invariants. A file
    is checked as it is, so its advice differs: nothing of it is repaired."""
    try:
        count, torn, skipped_lines, violations = _checked(path, is_file=is_file)
    except (LogCorrupted, LogFormatUnsupported) as e:
        print(f"andon: cannot read the log: {e}", file=sys.stderr)
        return EXIT_USAGE
    skipped = ""
    if skipped_lines:
        skipped = f" ({skipped_lines} live-only line(s) of 'andon run --json' skipped)"
    if torn is not None:
        repairable = "" if is_file else " (repairable)"
        print(f"torn tail: {torn.length} bytes at offset {torn.offset}{repairable}")
    if not violations:
        print(f"ok: {count} records{skipped}, every invariant holds")
        return EXIT_OK
    for v in violations:
        print(f"seq {v.seq}: [{v.rule}] {v.message}")
    if is_file:
        print(
            f"{len(violations)} violation(s) in {count} records{skipped}; a file is "
            "checked as it is: the log of a running or crashed session ends in an open turn "
            "(check or repair its folder instead)"
        )
    else:
        print(f"{len(violations)} violation(s); a crashed session is fixed with 'andon repair'")
    return EXIT_FAILED


def _checked(
    path: Path, *, is_file: bool
) -> tuple[int, TornTail | None, int, Sequence[InvariantViolation]]:
    """Records, torn tail, live-only lines skipped and violations of a log, streamed (no record
    is held): a session folder's from its index where a valid one is there (docs/log-format.md,
    The index of a long log), a file as it is."""
    from andon.session import check, iter_records, summarize

    if not is_file:
        summary = summarize(path)
        return summary.records, summary.torn, 0, summary.violations
    stream = iter_records(path)
    count = 0

    def counted() -> Iterator[Record]:
        nonlocal count
        for record in stream:
            count += 1
            yield record

    violations = check(counted())
    return count, stream.torn, stream.skipped, violations


def _session_summary(folder: Path) -> dict[str, Any]:
    """One ``andon sessions`` entry: read the log (no lock), ask the lock whether it is live."""
    from andon.session import SessionStart, TurnEnd, TurnStart, iter_records, live_holder

    entry: dict[str, Any] = {"session_id": folder.name, "path": str(folder), "started": None}
    entry.update(cwd=None, ended=None, open_turn=None, live=False, pid=None)
    try:
        for record in iter_records(folder):
            match record.data:
                case SessionStart(session_id=sid, cwd=cwd, created=created):
                    entry.update(session_id=sid, cwd=cwd, started=created)
                case TurnStart(turn=turn):
                    entry["open_turn"] = turn
                case TurnEnd(reason=reason):
                    entry.update(open_turn=None, ended=reason.to_json())
                case _:
                    pass
    except (AndonError, OSError, ValueError) as e:
        entry["error"] = str(e)
    holder = live_holder(folder)
    if holder is not None:
        entry.update(live=True, pid=holder.pid)
    if entry["started"] is None:
        with contextlib.suppress(OSError):
            entry["started"] = (folder / "events.jsonl").stat().st_mtime
    return entry


def _sessions(root: Path, *, as_json: bool) -> int:
    from andon.session import is_temporary

    # A hidden ``.<id>.new-…`` folder is a session its creator never finished opening.
    folders = [
        p
        for p in (root.iterdir() if root.is_dir() else ())
        if not is_temporary(p.name) and (p / "events.jsonl").is_file()
    ]
    entries = sorted(
        (_session_summary(p) for p in folders), key=lambda e: e["started"] or 0, reverse=True
    )
    if not entries and not as_json:
        print(f"andon: no sessions under {root}", file=sys.stderr)
    for e in entries:
        if as_json:
            sys.stdout.write(json.dumps(e, ensure_ascii=False) + "\n")
            continue
        started = "-"
        if e["started"] is not None:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["started"]))
        if "error" in e:
            ended = "unreadable"
        elif e["open_turn"] is not None:
            ended = f"turn {e['open_turn']} running" if e["live"] else f"turn {e['open_turn']} open"
        elif e["ended"] is not None:
            ended = str(e["ended"].get("kind"))
        else:
            ended = "no turn"
        live = f"live (pid {e['pid']})" if e["live"] else "cold"
        print(f"{e['session_id']}  {started}  {e['cwd'] or '-'}  {ended}  {live}")
    sys.stdout.flush()
    return EXIT_OK


def _repair(folder: Path, *, dry_run: bool) -> int:
    from andon.session import repair

    try:
        report = repair(folder, dry_run=dry_run)
    except (LogCorrupted, LogFormatUnsupported) as e:
        print(f"andon: cannot repair: {e}", file=sys.stderr)
        return EXIT_USAGE
    verb = "would append" if dry_run else "appended"
    if not report.repaired:
        print("nothing to repair: the log is balanced")
        return EXIT_OK
    if report.torn is not None:
        where = report.torn_file or "a .torn file"
        moved = "would be moved" if dry_run else "moved"
        print(f"torn tail of {report.torn.length} bytes {moved} to {where}")
    for record in report.appended:
        print(f"{verb}: {json.dumps(record.to_dict(), ensure_ascii=False)}")
    if report.leftovers:
        killed = "would kill" if dry_run else f"killed {report.killed_leftovers} of"
        print(f"{killed} {len(report.leftovers)} leftover process(es) of interrupted tool calls")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
