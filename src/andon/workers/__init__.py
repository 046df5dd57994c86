"""The worker layer: the worker process, process-group control and the built-in tools.

An internal face, with no stability promise: users define and register tools through
``andon.tools`` (docs/architecture.md, Who the names are for)."""

from andon.workers._builtins import BASH, default
from andon.workers._containment import (
    CgroupTree,
    cgroup2_root,
    detect_mode,
)
from andon.workers._forkserver import (
    FORKSERVER_MODULE,
    ForkReply,
    dump_request,
    read_reply,
    write_request,
)
from andon.workers._main import Worker, WorkerOptions, worker_main
from andon.workers._program import (
    KEYS_END,
    WORKER_REFUSED,
    WorkerProgram,
    default_worker_id,
    load_tools,
    read_keys,
    run_worker_program,
)
from andon.workers._registry import (
    ArgumentError,
    Tool,
    ToolKind,
    ToolRegistry,
    schema_from_signature,
    tool,
    validate_arguments,
)

__all__ = [
    "BASH",
    "FORKSERVER_MODULE",
    "KEYS_END",
    "WORKER_REFUSED",
    "ArgumentError",
    "CgroupTree",
    "ForkReply",
    "Tool",
    "ToolKind",
    "ToolRegistry",
    "Worker",
    "WorkerOptions",
    "WorkerProgram",
    "cgroup2_root",
    "default",
    "default_worker_id",
    "detect_mode",
    "dump_request",
    "load_tools",
    "read_keys",
    "read_reply",
    "run_worker_program",
    "schema_from_signature",
    "tool",
    "validate_arguments",
    "worker_main",
    "write_request",
]
