"""andon: a supervisor for LLM agent loops in which stopping is a first-class operation.

The top-level names are loaded lazily (PEP 562) so that importing a lower layer, for example in a
worker process, does not drag in the supervisor. This module imports nothing at all when loaded:
the ``andon`` command's entry point runs after it, and every millisecond before the command's
signal handlers are installed is a moment in which a CI runner's signal would kill the process
by its default action.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

# name -> module that defines it. Names of later layers are added as those layers land.
_EXPORTS: dict[str, str] = {
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

__all__ = ["__version__", *sorted(_EXPORTS)]


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
