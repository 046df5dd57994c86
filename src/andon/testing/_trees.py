"""Process trees that are hard to stop, shared by the tests and the benchmarks.

Each is a bash script for the ``bash`` tool. They print ``ready`` once every process is in place,
so a caller can wait for that line instead of sleeping.
"""

from __future__ import annotations

import shlex

__all__ = ["SHELL_SLEEP", "STUBBORN", "TRAP_INT", "benchmark_tree", "leader_obeys_member_stubborn"]

# Dies on SIGINT (bash execs the single command, so the leader is ``sleep`` itself).
SHELL_SLEEP = "echo ready; exec sleep 1000"

# Ignores SIGINT, exits on SIGTERM.
TRAP_INT = "trap '' INT; echo ready; while :; do sleep 0.05; done"

# Ignores SIGINT and SIGTERM: only SIGKILL ends it (and its sleeps inherit the ignores).
STUBBORN = "trap '' INT TERM; echo ready; while :; do sleep 0.05; done"


def leader_obeys_member_stubborn() -> str:
    """The leader exits on SIGINT; a background member ignores SIGINT and SIGTERM.

    The member itself prints ``ready``, after its trap is set, so no signal can beat the trap.
    """
    return "bash -c \"trap '' INT TERM; echo ready; while :; do sleep 0.05; done\" & sleep 1000"


def benchmark_tree(append_to: str, width: int = 45) -> str:
    """About 50 processes: background jobs that ignore SIGINT (as POSIX makes a non-interactive
    shell's background jobs do), a ``setsid`` escapee, and a double-forked daemon that appends to
    ``append_to`` every 10 ms. The foreground ``sleep`` obeys SIGINT."""
    target = shlex.quote(append_to)
    daemon = f"while :; do echo tick >> {target}; sleep 0.01; done"
    return "\n".join(
        [
            f"for i in $(seq 1 {width}); do sleep 1000 & done",
            # Each job ignores SIGINT only once its forked shell has set that up, and it surely
            # has once it runs sleep: before "ready" every job must, or a cancel that lands early
            # kills some by SIGINT and the tree is not the one this stands for.
            'for p in $(jobs -p); do while [ "$(cat /proc/$p/comm 2>/dev/null)" != sleep ]; '
            "do sleep 0.01; done; done",
            "setsid sleep 1000 &",
            f"( setsid bash -c {shlex.quote(daemon)} & )",
            # wait until the daemon has written once, so it surely exists before "ready"
            f"while [ ! -s {target} ]; do sleep 0.01; done",
            "echo ready",
            "sleep 1000",
        ]
    )
