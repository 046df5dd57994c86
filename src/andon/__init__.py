"""andon: a supervisor for LLM agent loops in which stopping is a first-class operation.

The layout, bottom to top (each layer imports only those below it)::

    andon.base        errors, cancel causes and signals, the clock, ids, the grace ladder
    andon.procs       process identity: finding and signalling processes, and only ours
    andon.protocol    the wire between supervisor and workers
    andon.session     the append-only log: records, reader, writer, check, repair
    andon.workers     the worker process and the built-in tools
    andon.llm         the Model protocol and its adapters
    andon.fleet       the worker pool and the launchers that start workers
    andon.supervisor  the agent, its turns, the tool executor, hooks
    andon.testing     a mock model server and other helpers for tests
    andon.cli         the ``andon`` command

Names for users: those of this package, ``andon.cancel``, ``andon.errors``, ``andon.hooks``,
``andon.tools`` and ``andon.supervisor``, and the reading side of ``andon.session``, the model seam
of ``andon.llm``, the pool and launchers of ``andon.fleet`` and the mock server of
``andon.testing``. Everything else public is internal, with no stability promise
(docs/architecture.md, Who the names are for).

The top-level names are loaded lazily (PEP 562) so that importing a lower layer, for example in a
worker process, does not drag in the supervisor. This module imports nothing at all when loaded:
the ``andon`` command's entry point runs after it, and every millisecond before the command's
signal handlers are installed is a moment in which a CI runner's signal would kill the process
by its default action.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    # What the lazy names below are, for a type checker (nothing of it runs): without these, every
    # name reached through ``import andon`` would be ``Any`` to a user's mypy.
    from typing import Any

    # (``X as X``: an explicit re-export.)
    from andon import cancel as cancel
    from andon import errors as errors
    from andon import hooks as hooks
    from andon import llm as llm
    from andon import session as session
    from andon import tools as tools
    from andon.base import AbortController as AbortController
    from andon.base import AbortSignal as AbortSignal
    from andon.base import AndonError as AndonError
    from andon.base import GracePolicy as GracePolicy
    from andon.base import __version__ as __version__
    from andon.fleet import WorkerPoolConfig as WorkerPoolConfig
    from andon.supervisor import Agent as Agent
    from andon.supervisor import open_agent as open_agent
    from andon.workers import tool as tool

# name -> module that defines it. Names of later layers are added as those layers land.
_EXPORTS: dict[str, str] = {
    "__version__": "andon.base",
    "AbortController": "andon.base",
    "AbortSignal": "andon.base",
    "AndonError": "andon.base",
    "GracePolicy": "andon.base",
    "Agent": "andon.supervisor",
    "WorkerPoolConfig": "andon.fleet",
    "open_agent": "andon.supervisor",
    "tool": "andon.workers",
    "cancel": "andon.cancel",
    "errors": "andon.errors",
    "hooks": "andon.hooks",
    "tools": "andon.tools",
    "session": "andon.session",
    "llm": "andon.llm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'andon' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(module_name)
    value = module if module_name == f"andon.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
