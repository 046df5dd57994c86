"""The ``andon`` command.

Every user mistake becomes one clear line on stderr and exit code 2; a traceback is shown only with
``--debug``. Commands that exist in the design but are not built yet are not offered here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from andon import __version__
from andon.base import AndonError, LogCorrupted, LogFormatUnsupported, SessionLive

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"andon: {message} (see 'andon {self._sub_name()}--help')\n")

    def _sub_name(self) -> str:
        parts = self.prog.split()
        return f"{parts[1]} " if len(parts) > 1 else ""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="andon", description="Supervise LLM agent loops; stop them cleanly.")
    parser.add_argument("--version", action="version", version=f"andon {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    log = sub.add_parser("log", help="show a session's transcript")
    log.add_argument("session", metavar="DIR")
    log.add_argument("--json", action="store_true", help="one JSON record per line")

    check = sub.add_parser("check", help="check a session log's invariants")
    check.add_argument("session", metavar="DIR")

    repair = sub.add_parser("repair", help="repair a session whose last run crashed")
    repair.add_argument("session", metavar="DIR")
    repair.add_argument("--dry-run", action="store_true", help="say what would be appended")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (AndonError, OSError) as e:
        if args.debug:
            raise
        print(f"andon: {_describe(e)}", file=sys.stderr)
        return EXIT_USAGE if _is_usage(e) else EXIT_FAILED
    except BrokenPipeError:
        # `andon log DIR | head` closed our stdout: not an error worth a word.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _is_usage(error: BaseException) -> bool:
    return isinstance(error, SessionLive | FileNotFoundError | NotADirectoryError)


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename:
        return f"{error.strerror or error}: {error.filename}"
    return str(error)


def _session_dir(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise NotADirectoryError(2, "no such session folder", value)
    if not (path / "events.jsonl").exists():
        raise FileNotFoundError(2, "not a session folder (no events.jsonl)", value)
    return path


def _dispatch(args: argparse.Namespace) -> int:
    match args.command:
        case "log":
            return _log(_session_dir(args.session), as_json=args.json)
        case "check":
            return _check(_session_dir(args.session))
        case "repair":
            return _repair(_session_dir(args.session), dry_run=args.dry_run)
    raise AssertionError(f"unhandled command {args.command!r}")


def _log(folder: Path, *, as_json: bool) -> int:
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
        print(
            f"[the log ends in an incomplete line ({records.torn.length} bytes): an append in "
            "progress, or a crash; 'andon repair' sets it aside]"
        )
    sys.stdout.flush()
    return EXIT_OK


def _check(folder: Path) -> int:
    from andon.session import check, read

    try:
        records = read(folder)
    except (LogCorrupted, LogFormatUnsupported) as e:
        print(f"andon: cannot read the log: {e}", file=sys.stderr)
        return EXIT_USAGE
    violations = check(records)
    if records.torn is not None:
        print(
            f"torn tail: {records.torn.length} bytes at offset {records.torn.offset} (repairable)"
        )
    if not violations:
        print(f"ok: {len(records)} records, every invariant holds")
        return EXIT_OK
    for v in violations:
        print(f"seq {v.seq}: [{v.rule}] {v.message}")
    print(f"{len(violations)} violation(s); a crashed session is fixed with 'andon repair'")
    return EXIT_FAILED


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
