"""Identifiers of the log (docs/log-format.md, Ids): message ids, session ids and andon's own
tool-call ids."""

from __future__ import annotations

import re
import secrets

from andon.base._errors import ConfigError

__all__ = [
    "call_id",
    "call_tag",
    "check_session_id",
    "executor_id",
    "is_call_id",
    "is_message_id",
    "message_id",
    "parse_call_id",
    "session_id",
]

_MESSAGE_ID = re.compile(r"m-[0-9a-f]{12}")
# A session id is half of every call's process tag (``<session id>-<call id>``), which names the
# call's cgroup and is matched byte for byte in /proc/<pid>/environ: a letter or digit first (never
# '.' or '..'), then letters, digits, '.', '_' and '-'. Tags stay unique: a call id
# (``c<turn>-<step>-<n>``, no '.' or '_') is the tag's last three '-'-separated parts, so
# ``tag.rsplit("-", 3)`` gives back the one owner and call id it was made of.
_TAG_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SESSION_ID_FORM = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_CALL_ID = re.compile(r"c([1-9][0-9]*)-([1-9][0-9]*)-([1-9][0-9]*)")


def message_id() -> str:
    """``"m-"`` + 12 hex digits."""
    return "m-" + secrets.token_hex(6)


def session_id() -> str:
    """``"s-"`` + 12 hex digits."""
    return "s-" + secrets.token_hex(6)


def check_session_id(value: object) -> str:
    """``value`` if it can be a session id (:data:`SESSION_ID_FORM`: ``my_session``,
    ``build.42``, ``github-7781-1``); else ``ConfigError`` saying the allowed form."""
    if not isinstance(value, str) or _TAG_PART.fullmatch(value) is None:
        raise ConfigError(
            f"session_id {value!r} cannot be used: it names every process of the session's tool "
            f"calls, so it must be {SESSION_ID_FORM}"
        )
    return value


def executor_id() -> str:
    """``"x-"`` + 12 hex digits: the owner of calls run outside any session (library use)."""
    return "x-" + secrets.token_hex(6)


def call_tag(owner: str, call_id: str) -> str:
    """The unique tag of one tool call: its owner (a session id) and its call id.

    Call ids repeat in every session (``c1-1-1``); the owner's random part does not. The tag is
    what every process of the call carries in its environment and what its cgroup is named
    after, and crash repair derives it again from the log (session id + call id). ``ValueError``
    unless both parts are safe in a file name.
    """
    for part in (owner, call_id):
        if _TAG_PART.fullmatch(part) is None:
            raise ValueError(f"{part!r} cannot name a call's processes ({SESSION_ID_FORM})")
    return f"{owner}-{call_id}"


def call_id(turn: int, step: int, n: int) -> str:
    """andon's id of the n-th call (1-based, model order) of a step: ``"c<turn>-<step>-<n>"``.

    Unique in a session and safe as a file name (it names the spill file).
    """
    if turn < 1 or step < 1 or n < 1:
        raise ValueError(f"turn, step and n start at 1 (got {turn}, {step}, {n})")
    return f"c{turn}-{step}-{n}"


def parse_call_id(value: str) -> tuple[int, int, int]:
    """The inverse of :func:`call_id`; ``ValueError`` for anything else."""
    match = _CALL_ID.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not an andon call id (c<turn>-<step>-<n>)")
    return int(match[1]), int(match[2]), int(match[3])


def is_call_id(value: object) -> bool:
    return isinstance(value, str) and _CALL_ID.fullmatch(value) is not None


def is_message_id(value: object) -> bool:
    return isinstance(value, str) and _MESSAGE_ID.fullmatch(value) is not None
