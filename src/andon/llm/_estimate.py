"""How many prompt tokens a request will cost, without a tokenizer (docs/models.md, Estimating
prompt tokens).

The estimate is the UTF-8 size of what is sent, the messages and the tool schemas as compact JSON,
divided by a bytes-per-token ratio. The ratio starts conservative (:data:`DEFAULT_BYTES_PER_TOKEN`,
below what English text and code take with the usual tokenizers) and is calibrated by what the
provider reports: every ``usage.prompt_tokens`` of a request gives one sample, ``size / tokens``.

Why it errs high everywhere: an over-estimate only compacts a history a little early; an
under-estimate sends a request the server refuses. So the ratio in use is the *lower* median of
the last few samples (one wild report, a proxy's made-up usage, a cached count, cannot move it), it
is clamped to a range real tokenizers stay in, every estimate carries a safety margin, and an
overflow that names the request's tokens forces the ratio down at once (:meth:`force_at_least`).

Pure: no I/O, no clock, nothing shared.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["DEFAULT_BYTES_PER_TOKEN", "TokenEstimator"]

DEFAULT_BYTES_PER_TOKEN: Final = 3.0
"""The ratio before any calibration. English prose and code run near 4 bytes per token with
current BPE tokenizers, JSON punctuation and digits lower; 3 errs high for all of them (CJK text,
3 bytes a character and about a token each, is where the floor below matters)."""

MIN_BYTES_PER_TOKEN: Final = 1.0
"""No sample goes below this: a byte-level tokenizer never needs more than one token a byte (a
lower report says the server counts something we did not send, such as a long template)."""

MAX_BYTES_PER_TOKEN: Final = 6.0
"""No sample goes above this: beyond it a report is a cached count or a made-up one, and believing
it would under-estimate every later request."""

SAFETY: Final = 1.1
"""Every estimate is the size over the ratio, times this."""

SAMPLES: Final = 8
"""How many recent samples the ratio is the lower median of."""

MIN_SAMPLE_BYTES: Final = 256
"""A request smaller than this teaches nothing: the server's per-message template tokens dominate
it."""


def request_bytes(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
    """The UTF-8 size of ``messages`` and ``tools`` as compact JSON: what the estimate divides."""
    text = json.dumps(
        [list(messages), list(tools)],
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,  # an estimate must never raise; the adapter refuses what cannot be sent
    )
    return len(text.encode("utf-8", "surrogatepass"))


def _clamp(ratio: float) -> float:
    return min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, ratio))


class TokenEstimator:
    """Estimates a request's prompt tokens; calibrated by the provider's reports.

    ``bytes_per_token`` is the starting ratio (clamped to
    [:data:`MIN_BYTES_PER_TOKEN`, :data:`MAX_BYTES_PER_TOKEN`]). Not thread-safe; one per model
    conversation.
    """

    def __init__(self, bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN) -> None:
        if isinstance(bytes_per_token, bool) or not (
            isinstance(bytes_per_token, int | float) and math.isfinite(bytes_per_token)
        ):
            raise ValueError(f"bytes_per_token must be a finite number, got {bytes_per_token!r}")
        if bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token!r}")
        self._default = _clamp(float(bytes_per_token))
        self._samples: deque[float] = deque(maxlen=SAMPLES)

    @property
    def bytes_per_token(self) -> float:
        """The ratio in use: the lower median of the recent samples, or the starting ratio while
        there are fewer than two (one report alone may not raise it)."""
        samples = sorted(self._samples)
        if len(samples) < 2:
            return min([self._default, *samples])
        return samples[(len(samples) - 1) // 2]

    @property
    def samples(self) -> int:
        """How many samples the ratio is computed from (at most :data:`SAMPLES`)."""
        return len(self._samples)

    def estimate(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> int:
        """The estimated prompt tokens of a request of ``messages`` and ``tools``."""
        size = request_bytes(messages, tools)
        return math.ceil(size * SAFETY / self.bytes_per_token)

    def observe(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        prompt_tokens: int,
    ) -> None:
        """Calibrate from the provider's ``usage.prompt_tokens`` for that very request.

        Ignored when the count is not a positive whole number or the request is too small to
        teach anything (:data:`MIN_SAMPLE_BYTES`); otherwise one clamped sample."""
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int):
            return
        if prompt_tokens <= 0:
            return
        size = request_bytes(messages, tools)
        if size < MIN_SAMPLE_BYTES:
            return
        self._samples.append(_clamp(size / prompt_tokens))

    def force_at_least(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        tokens: int,
    ) -> None:
        """After an overflow said the request of ``messages`` and ``tools`` had ``tokens`` input
        tokens: from now on :meth:`estimate` of that request is at least ``tokens`` (unless the
        ratio would go below :data:`MIN_BYTES_PER_TOKEN`), and of every other request higher in
        the same proportion. Later reports raise the ratio again, a sample at a time."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            return
        size = request_bytes(messages, tools)
        ratio = _clamp(size / tokens)
        if not self._samples:
            self._samples.append(ratio)
        # Every sample above the forced ratio comes down to it: the lower median is then at most
        # the forced ratio, and the samples still to come move it up one by one.
        for index, sample in enumerate(self._samples):
            self._samples[index] = min(sample, ratio)
        self._default = min(self._default, ratio)

    def __repr__(self) -> str:
        return f"<TokenEstimator {self.bytes_per_token:.3f} bytes/token, {self.samples} samples>"
