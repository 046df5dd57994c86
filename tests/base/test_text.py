"""The one rule for outside bytes (docs/log-format.md, Text): text gets U+FFFD, file names a
reversible ``\\xHH`` escape."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andon.base import clean_text, name_path, show_name


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"plain", "plain"),
        ("caf\u00e9".encode(), "caf\u00e9"),
        (b"fix \xff", "fix \ufffd"),
        (b"cut \xe2\x82", "cut \ufffd"),  # a sequence cut short is one U+FFFD
        (b"\xed\xa0\xbd", "\ufffd\ufffd\ufffd"),  # CESU-8: a surrogate is not UTF-8
        (b"\xff\xfeh\x00", "\ufffd\ufffdh\x00"),  # a UTF-16 BOM
    ],
)
def test_bytes_and_their_surrogate_escaped_str_become_the_same_text(raw: bytes, text: str) -> None:
    assert clean_text(raw) == text
    assert clean_text(os.fsdecode(raw)) == text  # argv, os.listdir, surrogateescape stdin
    assert clean_text(text) == text


def test_a_lone_surrogate_that_stands_for_no_byte_is_u_fffd() -> None:
    assert clean_text("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    clean_text("a\ud800b").encode("utf-8")  # valid Unicode: no error


def test_valid_text_is_returned_as_it_is() -> None:
    text = "caf\u00e9 \U0001f600" * 1000
    assert clean_text(text) is text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (b"plain.txt", "plain.txt"),
        ("caf\u00e9.txt".encode(), "caf\u00e9.txt"),
        (b"caf\xe9.txt", "caf\\xe9.txt"),
        (b"dir/\xff\xfe", "dir/\\xff\\xfe"),
        # A name that merely looks like an escape keeps its backslash doubled: never misread.
        (b"a\\xff", "a\\\\xff"),
        (b"back\\slash\xe9", "back\\\\slash\\xe9"),
    ],
)
def test_a_file_name_is_shown_visibly_and_maps_back_to_its_bytes(raw: bytes, shown: str) -> None:
    assert show_name(os.fsdecode(raw)) == shown
    assert show_name(raw) == shown
    shown.encode("utf-8")
    assert os.fsencode(name_path(shown)) == raw


def test_an_ordinary_path_is_its_own_name() -> None:
    assert name_path("src/main.c") == "src/main.c"
    assert name_path("a\\b") == "a\\b"  # a backslash that starts no escape is itself
    assert name_path("a\\x41") == "a\\x41"  # only bytes 80..ff are ever escaped
    assert name_path("caf\\xc3\\xa9") == "caf\u00e9"  # UTF-8 spelled by bytes is the character


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_show_name_and_name_path_are_exact_inverses_for_any_bytes(raw: bytes) -> None:
    shown = show_name(os.fsdecode(raw))
    shown.encode("utf-8")  # valid text: the log, the wire and the model take it
    assert os.fsencode(name_path(shown)) == raw


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_clean_text_is_valid_and_keeps_every_valid_character(raw: bytes) -> None:
    text = clean_text(raw)
    text.encode("utf-8")
    assert clean_text(os.fsdecode(raw)) == text
    assert text.replace("\ufffd", "") == raw.decode("utf-8", "ignore").replace("\ufffd", "")
