"""Counts in the English andon prints and logs: one rule, so "1 process" and "2 processes" read
the same in a tool result, a transcript and a terminal line."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, made plural unless ``n`` is 1: ``-es`` after an ``s``, else ``-s``
    (every word andon counts is regular)."""
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"
