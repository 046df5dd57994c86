"""The prompt-token estimate (docs/models.md, Estimating prompt tokens): errs high before any
report, calibrates from reported usage, shrugs off a wild report, and yields to an overflow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from andon.llm import TokenEstimator
from andon.testing import mock_prompt_tokens

TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
)


def history(n: int, text: str = "build output line\n") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are careful."}]
    for i in range(n):
        messages.append({"role": "user", "content": f"step {i}: " + text * (i + 3)})
        messages.append({"role": "assistant", "content": f"done {i}"})
    return messages


def served(messages: list[dict[str, Any]], tools: tuple[dict[str, Any], ...] = TOOLS) -> int:
    """What the mock server (one fixed rule, 4 bytes a token) reports for the request."""
    return mock_prompt_tokens({"messages": messages, "tools": list(tools)})


@pytest.mark.parametrize(
    "text", ["plain ascii words and code();\n", "数字と漢字の混ざった文章。", '{"k": [1, 2, 3]} ']
)
def test_before_any_report_it_errs_high(text: str) -> None:
    estimator = TokenEstimator()
    messages = history(5, text)
    assert estimator.estimate(messages, TOOLS) >= served(messages)
    # ...by the ratio of 4 to the default 3 and the margin, not by an order of magnitude.
    assert estimator.estimate(messages, TOOLS) <= 2 * served(messages)


def test_reports_calibrate_it_close_to_the_server_and_still_high() -> None:
    estimator = TokenEstimator()
    for n in range(1, 6):
        messages = history(n)
        estimator.observe(messages, TOOLS, served(messages))
    later = history(12)
    estimate, truth = estimator.estimate(later, TOOLS), served(later)
    assert truth <= estimate <= 1.15 * truth
    assert estimator.bytes_per_token == pytest.approx(4.0, rel=0.02)


@pytest.mark.parametrize("wild", [1, 10**9])
def test_one_wild_report_does_not_wreck_it(wild: int) -> None:
    estimator = TokenEstimator()
    for n in range(1, 6):
        estimator.observe(history(n), TOOLS, served(history(n)))
    before = estimator.estimate(history(12), TOOLS)
    estimator.observe(history(6), TOOLS, wild)
    # It moves the lower median by one honest sample at most (the samples differ by rounding).
    assert before <= estimator.estimate(history(12), TOOLS) <= 1.01 * before


def test_a_single_report_may_lower_the_ratio_but_not_raise_it() -> None:
    high = TokenEstimator()
    high.observe(history(3), TOOLS, 1)  # claims ~1 token for the whole request
    assert high.bytes_per_token == 3.0
    low = TokenEstimator()
    low.observe(history(3), TOOLS, 10**6)
    assert low.bytes_per_token == 1.0  # clamped at the floor


def test_reports_that_teach_nothing_are_ignored() -> None:
    estimator = TokenEstimator()
    estimator.observe([{"role": "user", "content": "hi"}], (), 9)  # too small
    for bad in (0, -5, True):
        estimator.observe(history(4), TOOLS, bad)
    estimator.observe(history(4), TOOLS, 2.5)  # type: ignore[arg-type]
    assert estimator.samples == 0 and estimator.bytes_per_token == 3.0


def test_an_overflow_forces_the_estimate_up_at_once_and_reports_bring_it_back() -> None:
    estimator = TokenEstimator()
    for n in range(1, 9):
        estimator.observe(history(n), TOOLS, served(history(n)))
    messages = history(10)
    said = 2 * served(messages)  # the server counted twice what the estimate assumes
    assert estimator.estimate(messages, TOOLS) < said
    estimator.force_at_least(messages, TOOLS, said)
    assert estimator.estimate(messages, TOOLS) >= said
    for n in range(1, 9):  # a full window of honest reports: calibrated again
        estimator.observe(history(n), TOOLS, served(history(n)))
    assert estimator.bytes_per_token == pytest.approx(4.0, rel=0.02)


def test_force_before_any_report_and_with_nonsense() -> None:
    estimator = TokenEstimator()
    messages = history(4)
    estimator.force_at_least(messages, TOOLS, 10 * served(messages))
    assert estimator.estimate(messages, TOOLS) >= 10 * served(messages) or (
        estimator.bytes_per_token == 1.0  # the floor: a byte is never more than a token
    )
    for bad in (0, -1, False):
        estimator.force_at_least(messages, TOOLS, bad)


def test_it_never_raises_on_what_it_is_given() -> None:
    estimator = TokenEstimator()
    odd: list[dict[str, Any]] = [{"role": "user", "content": "\ud800 lone surrogate", "x": {1, 2}}]
    assert estimator.estimate(odd) > 0
    assert estimator.estimate([]) >= 1
    json.dumps(repr(estimator))


@pytest.mark.parametrize("ratio", [0, -1.0, float("nan"), float("inf"), True])
def test_a_bad_starting_ratio_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match="bytes_per_token"):
        TokenEstimator(ratio)
