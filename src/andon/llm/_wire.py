"""Values read off the wire, made safe to keep: text without lone surrogates, and token usage.

Both are used where a stream is parsed (``_sse``) and where a script imitates one (``_script``), so
a scripted reply and a real one become the same chunks.

**Text.** JSON may escape a UTF-16 surrogate on its own (``"\\ud83d"``): a proxy that cuts a reply
into pieces by UTF-16 index splits an emoji that way. ``json.loads`` turns an escaped *pair* into
one character, but leaves a lone surrogate in the ``str``, and such a string cannot be encoded as
UTF-8: the session log refuses it, which used to fail the whole turn. :func:`valid_text` replaces
each lone surrogate with U+FFFD and keeps everything else (a pair given as two code units, as a
Python literal or YAML's ``"\\ud83d\\ude00"`` produce, is joined into its character).

**Usage.** Providers report the same counts under different names; :func:`usage_from_wire` reads
all of them leniently (accounting is optional: a strange value is dropped, never fatal).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from andon.llm._types import Usage

__all__ = ["REPLACEMENT", "ends_in_high_surrogate", "usage_from_wire", "valid_text"]

REPLACEMENT: Final = "\ufffd"
"""What a lone surrogate becomes."""


def valid_text(text: str) -> str:
    """``text`` with every lone UTF-16 surrogate replaced by U+FFFD (and split pairs joined)."""
    try:
        text.encode("utf-8")  # the common case, at C speed: no surrogate at all
    except UnicodeEncodeError:
        # Back through UTF-16: "surrogatepass" writes each code unit as it is; decoding joins
        # valid pairs and turns each lone unit into exactly one U+FFFD.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def ends_in_high_surrogate(text: str) -> bool:
    """Whether ``text`` ends in the first half of a surrogate pair (the rest may come next)."""
    return bool(text) and "\ud800" <= text[-1] <= "\udbff"


def _count(value: object) -> int | None:
    """A token count: an int >= 0 that is not a bool, else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _detail(raw: Mapping[str, Any], group: str, name: str) -> int | None:
    details = raw.get(group)
    return _count(details.get(name)) if isinstance(details, Mapping) else None


def usage_from_wire(raw: Mapping[str, Any]) -> Usage | None:
    """The :class:`Usage` of a chat-completions ``usage`` object, or ``None`` without valid
    ``prompt_tokens`` and ``completion_tokens``.

    Cached prompt tokens are DeepSeek's ``prompt_cache_hit_tokens``, else OpenAI's
    ``prompt_tokens_details.cached_tokens``; uncached ones are DeepSeek's
    ``prompt_cache_miss_tokens``, else ``prompt_tokens`` minus the cached ones (when that is not
    negative). Reasoning tokens are ``completion_tokens_details.reasoning_tokens`` (both
    providers). A value that is not an int >= 0 (a bool, a float, a string) counts as absent.
    """
    prompt, completion = _count(raw.get("prompt_tokens")), _count(raw.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    cached = _count(raw.get("prompt_cache_hit_tokens"))
    if cached is None:
        cached = _detail(raw, "prompt_tokens_details", "cached_tokens")
    uncached = _count(raw.get("prompt_cache_miss_tokens"))
    if uncached is None and cached is not None and cached <= prompt:
        uncached = prompt - cached
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_prompt_tokens=cached,
        uncached_prompt_tokens=uncached,
        reasoning_tokens=_detail(raw, "completion_tokens_details", "reasoning_tokens"),
    )
