"""Outside bytes become valid Unicode here, and only here (docs/log-format.md, Text).

Whatever enters andon from outside may be any bytes: a prompt on argv or stdin, a ``--system``
file, a tool's output, a Python tool's result or error, an environment value, a file name. The
log, the wire (msgpack) and the model's JSON all need valid Unicode, and a lone surrogate in a
``str`` (what ``os.fsdecode``, ``sys.argv`` and ``surrogateescape`` stdin make of an invalid
byte) fails each of them far from where it came in. So every boundary passes its text through
one of two rules:

* :func:`clean_text` for text: each byte that is not valid UTF-8 (or each lone surrogate of a
  ``str``) becomes U+FFFD. Lossy, and meant to be: text is for reading.
* :func:`show_name` for file names, which a model must be able to name back: each byte that is
  not valid UTF-8 is written ``\\xHH`` (two lower-case hex digits) and a backslash of the name
  itself ``\\\\``, so the escape is visible, reversible, and a name that merely looks like an
  escape (a file really called ``a\\xff``) is shown ``a\\\\xff`` and never misread.
  :func:`name_path` is the inverse the file tools apply to every path they are given. The two
  are exact inverses for any ``str`` whose surrogates are escapes, so the same pair also carries
  paths and environment values over the wire to a worker without losing a byte.
"""

from __future__ import annotations

import os
import re

__all__ = ["clean_text", "cut_text", "name_path", "show_name"]

_SURROGATE = re.compile("[\ud800-\udfff]")
# Surrogates outside surrogateescape's range (U+DC80..U+DCFF, one per invalid byte) stand for no
# byte at all: a str that a tool built with chr(0xD800), say.
_NOT_AN_ESCAPE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
_NAME_ESCAPE = re.compile(r"\\\\|\\x([89a-fA-F][0-9a-fA-F])")


def clean_text(value: str | bytes | bytearray | memoryview) -> str:
    """``value`` as valid Unicode: bytes are decoded as UTF-8, and each invalid sequence (and
    each lone surrogate of a ``str``, an escaped byte or not) becomes U+FFFD. Valid text comes
    back unchanged (the same object, for a ``str``)."""
    if not isinstance(value, str):
        return bytes(value).decode("utf-8", "replace")
    if value.isascii() or _SURROGATE.search(value) is None:
        return value
    # Escaped bytes go back to bytes first, so a sequence cut in two (b"\xe2\x82") is one U+FFFD,
    # exactly as if the bytes had been decoded here.
    raw = _NOT_AN_ESCAPE.sub("\ufffd", value).encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")


def cut_text(text: str, max_bytes: int, what: str) -> str:
    """``text`` (valid Unicode) cut to at most ``max_bytes`` bytes of UTF-8, on a character
    boundary, with a last line saying so, naming ``what`` was cut ("the tool's result")."""
    if len(text) * 4 <= max_bytes:  # cannot be over: no need to encode it
        return text
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    # "ignore" drops only the character the cut split: the bytes are andon's own, valid UTF-8.
    head = encoded[:max_bytes].decode("utf-8", "ignore")
    return f"{head}\n[andon cut {what} at {max_bytes} of {len(encoded)} bytes]"


def show_name(name: str | bytes) -> str:
    """A file name (or path) as the model sees it: valid Unicode, with each byte that is not
    valid UTF-8 written ``\\xHH`` and a backslash written ``\\\\``. ``name_path`` undoes it."""
    text = os.fsdecode(name) if isinstance(name, bytes) else name
    text = _NOT_AN_ESCAPE.sub("\ufffd", text)  # not a byte: nothing to give back
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else c for c in text)


def name_path(shown: str) -> str:
    """The real path of a name as :func:`show_name` wrote it (a ``str`` that ``open`` and
    ``os`` take, invalid bytes as surrogate escapes). ``\\\\`` is a backslash and ``\\xHH`` (HH
    from 80 to ff) a byte; any other backslash is itself, so an ordinary path comes back as it
    was."""
    if "\\" not in shown:
        return shown

    def one(match: re.Match[str]) -> str:
        hexa = match[1]
        return "\\" if hexa is None else chr(0xDC00 + int(hexa, 16))

    # The result may hold a valid UTF-8 sequence spelled byte by byte (\xc3\xa9): back to bytes
    # and decoded as the file system would, so it names the same file as the character itself.
    spelled = _NAME_ESCAPE.sub(one, _NOT_AN_ESCAPE.sub("\ufffd", shown))
    return os.fsdecode(spelled.encode("utf-8", "surrogateescape"))
