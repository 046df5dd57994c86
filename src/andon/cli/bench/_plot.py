"""``--plot FILE.png``: the latency distribution of each scenario beside its floor (matplotlib)."""

from __future__ import annotations

from typing import Any

__all__ = ["plot"]


def plot(data: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = data["scenarios"]
    names = list(scenarios)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names)), 4.5))
    andon = [[v * 1000 for v in scenarios[n]["samples"]] for n in names]
    ax.boxplot(andon, positions=range(len(names)), widths=0.35, showfliers=True)
    for i, n in enumerate(names):
        floor = scenarios[n].get("floor_samples")
        if floor:
            ax.scatter([i + 0.3] * len(floor), [v * 1000 for v in floor], s=6, c="grey")
    ax.set_xticks(range(len(names)), names, rotation=30)
    ax.set_yscale("log")
    ax.set_ylabel("cancel → durable turn/end (ms, log)")
    grace = data["grace"]
    ax.set_title(
        f"andon bench interrupt: {data['runs']} runs, grace "
        f"{grace['term_after']},{grace['kill_after']} (grey: floor)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
