"""What a run cost: ``cost`` in ``run/summary`` (docs/models.md, Cost).

A small price table for the built-in DeepSeek specs, which ``[prices."MODEL"]`` tables in
``andon.toml`` override or extend (a custom ``URL#MODEL``, say). Prices are USD per million tokens,
in DeepSeek's three classes: prompt tokens served from the provider's context cache, the other
prompt tokens, and completion tokens (reasoning tokens are completion tokens: counted once).

Prices change: the table says where and when they were read (:data:`SOURCE`, :data:`READ_ON`),
and so does every ``priced_by`` it produces. A model in neither the table nor ``andon.toml``
(``openai:``, a custom URL, ``script:``) gets no ``cost`` at all, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from andon.base import ConfigError
from andon.llm import ModelIdentity

__all__ = [
    "BUILTIN",
    "PRICE_KEYS",
    "READ_ON",
    "SOURCE",
    "TABLE_NAME",
    "TOML_NAME",
    "Price",
    "cost",
    "parse_prices",
    "price_for",
]

PER_TOKENS: Final = 1_000_000
"""Prices are per this many tokens."""


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens of each class."""

    input_cache_hit: float
    input_cache_miss: float
    output: float


PRICE_KEYS: Final = ("input_cache_hit", "input_cache_miss", "output")
"""The keys of a ``[prices."MODEL"]`` table, all required."""

SOURCE: Final = "https://api-docs.deepseek.com/quick_start/pricing"
"""DeepSeek's "Models & Pricing" page."""

READ_ON: Final = "2026-12-03"
"""When the figures below were read (as quoted from :data:`SOURCE` on 2026-07-04)."""

TABLE_NAME: Final = f"andon built-in DeepSeek prices (read {READ_ON})"
"""``priced_by`` of a cost from :data:`BUILTIN`."""

TOML_NAME: Final = "andon.toml"
"""``priced_by`` of a cost from a ``[prices."MODEL"]`` table."""

BUILTIN: Final[Mapping[str, Price]] = MappingProxyType(
    {
        "deepseek-v4-flash": Price(input_cache_hit=0.0028, input_cache_miss=0.14, output=0.28),
        "deepseek-v4-pro": Price(input_cache_hit=0.003625, input_cache_miss=0.435, output=0.87),
    }
)
"""Built-in spec -> its price (one for each of ``andon.llm.DEEPSEEK_MODELS``); keyed by the spec,
so a ``URL#deepseek-v4-flash`` (a proxy, another host) is not priced by DeepSeek's table."""

_NO_SPLIT: Final = "no cache split reported: every prompt token priced as a cache miss"


def parse_prices(raw: object, path: Path) -> dict[str, Price]:
    """The ``prices`` table of ``andon.toml`` at ``path``: model name -> :class:`Price`.

    Every mistake is one :class:`ConfigError` line naming the file and the key."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f'{path}: prices must be a table of [prices."MODEL"] tables '
            f"(USD per 1M tokens: {', '.join(PRICE_KEYS)})"
        )
    out: dict[str, Price] = {}
    for model, table in raw.items():
        where = f'prices."{model}"'
        if not model.strip():
            raise ConfigError(f"{path}: {where}: the model name is empty")
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}: {where} must be a table with {', '.join(PRICE_KEYS)} (USD per 1M tokens)"
            )
        unknown = [key for key in table if key not in PRICE_KEYS]
        if unknown:
            raise ConfigError(
                f"{path}: {where}.{unknown[0]} is not a price (known: {', '.join(PRICE_KEYS)})"
            )
        values: dict[str, float] = {}
        for key in PRICE_KEYS:
            if key not in table:
                raise ConfigError(f"{path}: {where}.{key} is missing (USD per 1M tokens)")
            value = table[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(
                    f"{path}: {where}.{key} must be a finite number >= 0 (USD per 1M tokens), "
                    f"got {value!r}"
                )
            values[key] = float(value)
        out[model] = Price(**values)
    return out


def price_for(info: ModelIdentity, overrides: Mapping[str, Price]) -> tuple[Price, str] | None:
    """The price of ``info``'s model and what it comes from: ``andon.toml`` (by the model name the
    spec resolves to, ``info.name``) before the built-in table (by spec); None if neither has it."""
    if info.name in overrides:
        return overrides[info.name], TOML_NAME
    builtin = BUILTIN.get(info.spec)
    if builtin is not None:
        return builtin, TABLE_NAME
    return None


def cost(
    usage: Mapping[str, Any], info: ModelIdentity, overrides: Mapping[str, Price]
) -> dict[str, Any] | None:
    """``{"usd", "priced_by"}`` of a run's usage totals, or None for a model without a price.

    usd = (hit x cached + miss x uncached + output x completion tokens) / 1M. Prompt tokens not
    reported as cache hits are priced as misses (DeepSeek reports hit + miss = prompt; a provider
    that reports no split has every prompt token priced as a miss, and ``priced_by`` says so)."""
    found = price_for(info, overrides)
    if found is None:
        return None
    price, source = found
    prompt = _count(usage, "prompt_tokens")
    completion = _count(usage, "completion_tokens")
    cached = min(_count(usage, "cached_prompt_tokens"), prompt)
    # Requests that reported no split (a mixed run) leave prompt - cached - uncached > 0: misses.
    uncached = max(prompt - cached, _count(usage, "uncached_prompt_tokens"))
    usd = (
        cached * price.input_cache_hit
        + uncached * price.input_cache_miss
        + completion * price.output
    ) / PER_TOKENS
    split = "cached_prompt_tokens" in usage or "uncached_prompt_tokens" in usage
    return {"usd": round(usd, 6), "priced_by": source if split else f"{source}; {_NO_SPLIT}"}


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
