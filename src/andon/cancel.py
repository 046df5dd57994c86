"""Cancel causes and the abort primitive (re-exported from ``andon.base``)."""

from andon.base import (
    AbortController,
    AbortSignal,
    Cause,
    Disposed,
    Hook,
    Parent,
    User,
    any_signal,
    cause_from_dict,
)

__all__ = [
    "AbortController",
    "AbortSignal",
    "Cause",
    "Disposed",
    "Hook",
    "Parent",
    "User",
    "any_signal",
    "cause_from_dict",
]
