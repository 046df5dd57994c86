"""Helpers for tests, ours and users': hard-to-stop process trees, and (later) the mock model
server and log assertions."""

from andon.testing._trees import (
    SHELL_SLEEP,
    STUBBORN,
    TRAP_INT,
    benchmark_tree,
    leader_obeys_member_stubborn,
)

__all__ = [
    "SHELL_SLEEP",
    "STUBBORN",
    "TRAP_INT",
    "benchmark_tree",
    "leader_obeys_member_stubborn",
]
