"""``andon worker``: a tool worker that dials a supervisor (docs/scale-out.md, ``andon worker
--connect ENDPOINT``).

A container's or a remote host's worker starts with this command every time, so its entry is
light: ``andon.cli`` sends ``andon worker ...`` here before the rest of the command is imported
(the parser of every other command, the settings, the model and session layers, httpx), and the
process imports the worker side only (docs/benchmarks.md, Container workers). The full parser
(``andon --debug worker``, ``andon --help``) offers the same options, from
:func:`add_arguments`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from andon.base import AndonError, ConfigError, ContainmentSetting, describe_error
from andon.cli._parser import EXIT_USAGE, Parser

__all__ = ["HELP", "add_arguments", "main", "run"]

HELP = "run a tool worker that dials a supervisor (a container's main process, a host)"
_EXIT_FAILED = 1


def add_arguments(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--connect", required=True, metavar="ENDPOINT", help="ipc://PATH or tcp://HOST:PORT"
    )
    worker.add_argument("--id", dest="worker_id", help="the id the supervisor gave this worker")
    worker.add_argument(
        "--tools", default="default", metavar="SPEC", help="'default' or MODULE:NAME to import"
    )
    worker.add_argument(
        "--server-key",
        metavar="KEY|FILE",
        help="the supervisor's CURVE public key (tcp): 40 Z85 characters (write "
        "--server-key=KEY, as one may begin with '-'), 64 hex digits, or a file holding it",
    )
    worker.add_argument(
        "--keys", metavar="FILE|-", help="this worker's CURVE secret key file ('-': on stdin)"
    )
    worker.add_argument(
        "--forget-keys",
        action="store_true",
        help="delete the --keys file once read (a launcher's copy: no tool may read it)",
    )
    worker.add_argument(
        "--insecure", action="store_true", help="plain tcp, without CURVE (loopback only)"
    )
    worker.add_argument("--containment", choices=get_args(ContainmentSetting), default="auto")
    worker.add_argument(
        "--lifeline",
        action="store_true",
        help="stdin stays open while the launcher holds this worker; its end stops the worker",
    )
    worker.add_argument(
        "--welcome-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="exit if the supervisor has not accepted this worker by then (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    from andon.workers import WorkerProgram, default_worker_id, read_keys, run_worker_program

    program = WorkerProgram(
        endpoint=args.connect,
        worker_id=args.worker_id or default_worker_id(),
        tools=args.tools,
        server_key=_server_key(args.server_key) if args.server_key else None,
        keys=read_keys(args.keys, forget=args.forget_keys) if args.keys else None,
        insecure=args.insecure,
        containment=args.containment,
        welcome_timeout=args.welcome_timeout,
        lifeline=args.lifeline,
    )
    return run_worker_program(program)


def main(argv: Sequence[str] | None = None) -> int:
    """``andon worker ARGS`` (``argv``: the words after ``worker``; default from ``sys.argv``),
    with the full command's error handling: a mistake is one line and exit 2."""
    parser = Parser(prog="andon worker", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    try:
        return run(args)
    except (AndonError, OSError) as e:
        print(f"andon: {describe_error(e, typed=False)}", file=sys.stderr)
        usage = isinstance(e, ConfigError | FileNotFoundError | NotADirectoryError)
        return EXIT_USAGE if usage else _EXIT_FAILED
    except KeyboardInterrupt:
        print("andon: interrupted", file=sys.stderr)
        return 128 + 2


def _server_key(value: str) -> bytes:
    """A public key (40 Z85 characters or 64 hex digits, as launchers write it), or a file
    holding exactly one."""
    from andon.protocol import key_from_text, load_public_keys

    key = key_from_text(value)
    if key is not None and not Path(value).exists():
        return key
    found = load_public_keys(Path(value))
    if len(found) != 1:
        raise ConfigError(f"--server-key {value}: holds {len(found)} keys, not one")
    return next(iter(found))
