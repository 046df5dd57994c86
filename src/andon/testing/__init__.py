"""Helpers for tests, ours and users': hard-to-stop process trees and the mock model server (a
scripted OpenAI-compatible streaming endpoint on 127.0.0.1)."""

from andon.testing._mock_server import (
    SERVER_ONLY_FIELDS,
    MockModelServer,
    RecordedRequest,
)
from andon.testing._mock_server import main as mock_model_main
from andon.testing._trees import (
    SHELL_SLEEP,
    STUBBORN,
    TRAP_INT,
    benchmark_tree,
    leader_obeys_member_stubborn,
)

__all__ = [
    "SERVER_ONLY_FIELDS",
    "SHELL_SLEEP",
    "STUBBORN",
    "TRAP_INT",
    "MockModelServer",
    "RecordedRequest",
    "benchmark_tree",
    "leader_obeys_member_stubborn",
    "mock_model_main",
]
