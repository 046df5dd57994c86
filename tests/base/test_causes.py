from __future__ import annotations

import pytest

from andon.base import Cause, Disposed, Hook, Parent, User, cause_from_dict


@pytest.mark.parametrize("cause", [User(), Parent(), Hook("turn budget exceeded: 30s"), Disposed()])
def test_cause_round_trips(cause: Cause) -> None:
    data = cause.to_dict()
    assert data["kind"] == cause.kind
    assert cause_from_dict(data) == cause


def test_causes_compare_by_value_and_are_frozen() -> None:
    assert Hook("a") == Hook("a")
    assert Hook("a") != Hook("b")
    kinds: list[Cause] = [User(), Parent()]  # typed as causes: comparing two kinds is the point
    assert kinds[0] != kinds[1]
    with pytest.raises(AttributeError):
        Hook("a").reason = "b"  # type: ignore[misc]


@pytest.mark.parametrize(
    "bad",
    [None, "user", {}, {"kind": "nope"}, {"kind": "hook"}, {"kind": "hook", "reason": 3}],
)
def test_bad_cause_is_rejected_with_a_reason(bad: object) -> None:
    with pytest.raises(ValueError, match=r"cause|reason"):
        cause_from_dict(bad)
