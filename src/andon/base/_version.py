"""andon's version, written once: the top-level package, ``andon --version`` and the log's
``session/start`` and ``session/resumed`` records read it from here (a layer below the supervisor
may not import the top-level package, which stands for the supervisor's face)."""

from __future__ import annotations

from typing import Final

__all__ = ["__version__"]

__version__: Final = "0.1.0"
