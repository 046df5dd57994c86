"""Small helpers shared by the benchmark scripts (they live in ``andon._bench._stats``)."""

from andon._bench._stats import percentile, summary, table

__all__ = ["percentile", "summary", "table"]
