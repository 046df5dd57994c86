"""Percentiles and a plain-text table, shared by every benchmark."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ms", "percentile", "summary", "table"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p95, p99 and max of a non-empty sample."""
    return {
        "n": float(len(values)),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned first column, right-aligned others, a dashed rule under the header."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
