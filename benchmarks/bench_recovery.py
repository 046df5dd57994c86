"""Recovery benchmark: a thin wrapper of ``andon bench recovery`` (src/andon/_bench/_recovery.py).

python benchmarks/bench_recovery.py [--max-events 1000000] [--json]
"""

from __future__ import annotations

import sys

from andon.cli.bench import main

if __name__ == "__main__":
    sys.exit(main(["recovery", *sys.argv[1:]]))
