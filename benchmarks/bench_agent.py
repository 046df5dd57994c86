"""Cancel -> durable turn/end through the whole agent: a thin wrapper of ``andon bench interrupt``
for the streaming, stalled and tree scenarios (src/andon/_bench/_interrupt.py).

    python benchmarks/bench_agent.py [--runs 20] [--json]
"""

from __future__ import annotations

import sys

from andon.cli.bench import main

if __name__ == "__main__":
    scenarios = ["--scenario", "stream", "--scenario", "stall", "--scenario", "tree"]
    sys.exit(main(["interrupt", *scenarios, *sys.argv[1:]]))
