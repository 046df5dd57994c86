"""Small helpers shared by the benchmark scripts (they live in ``andon.cli.bench._stats``)."""

from andon.cli.bench._stats import percentile, summary, table

__all__ = ["percentile", "summary", "table"]
