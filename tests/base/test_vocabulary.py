"""The closed sets are declared once (andon.base): each frozenset is its Literal's words, and no
other module spells one of the sets out again (a second copy is how the wire and the log drift)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import andon.base._vocabulary as vocabulary
from andon.base import (
    CANCEL_STAGES,
    CONTAINMENTS,
    ENDED_BY,
    MESSAGE_SOURCES,
    REPLY_FINISHES,
    SIGNAL_STAGES,
    STREAMS,
    TURN_END_KINDS,
    CancelStage,
    Containment,
    EndedBy,
    MessageSource,
    ReplyFinish,
    SignalStage,
    Stream,
    TurnEndKind,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "andon"
SETS: list[tuple[object, frozenset[str]]] = [
    (Containment, CONTAINMENTS),
    (EndedBy, ENDED_BY),
    (MessageSource, MESSAGE_SOURCES),
    (ReplyFinish, REPLY_FINISHES),
    (SignalStage, SIGNAL_STAGES),
    (Stream, STREAMS),
    (TurnEndKind, TURN_END_KINDS),
]


def test_each_frozenset_holds_exactly_its_literals_words() -> None:
    for literal, words in SETS:
        assert frozenset(typing.get_args(literal)) == words
    assert CANCEL_STAGES == typing.get_args(CancelStage) == ("interrupt", "term", "kill")
    assert set(CANCEL_STAGES) < SIGNAL_STAGES


def _redeclared(text: str, words: tuple[str, ...]) -> bool:
    """Whether ``text`` spells a Literal or a collection that starts with the set's first words."""
    first, second = (re.escape(f'"{w}"') for w in words[:2])
    return re.search(rf"[\[(]\s*{first},\s*{second}", text) is not None


def test_no_module_declares_a_closed_set_again() -> None:
    here = Path(vocabulary.__file__).resolve()
    copies = [
        f"{path.relative_to(SRC)}: {typing.get_args(literal)[:2]}"
        for path in sorted(SRC.rglob("*.py"))
        if path.resolve() != here
        for literal, _ in SETS
        if _redeclared(path.read_text(), typing.get_args(literal))
    ]
    assert copies == []


def test_the_check_sees_a_copy() -> None:
    assert _redeclared(
        'X = Literal[\n    "cgroup",\n    "subreaper", "pgroup"]', ("cgroup", "subreaper")
    )
    assert not _redeclared('("cgroup")', ("cgroup", "subreaper"))
