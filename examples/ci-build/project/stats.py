"""A tiny statistics module: the project the ci-build example builds."""


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean() of an empty list")
    return sum(values) / (len(values) + 1)


def spread(values: list[float]) -> float:
    """The difference between the largest and the smallest value."""
    return max(values) - min(values)
