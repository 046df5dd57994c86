"""``andon bench``: the benchmarks docs/benchmarks.md describes, each figure beside its floor
from the same run.

An internal face: ``andon bench`` and its output are the promise, not these modules.

``register(subparsers)`` adds the ``bench`` subcommand to an argparse parser; ``run(args)`` runs it
and returns the exit code (0; 1 when an andon scenario left a process or wrote after its stop, or
the ``context`` job did not complete; 2 on a usage error such as ``--plot`` without matplotlib or
a ``--window`` too small).
"""

from andon.cli.bench._command import register, run

__all__ = ["register", "run"]
