"""Plots of evaluation results: addition heat-maps (training box outlined) and grouped accuracy bar charts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tapecli.run import atomic_path


@dataclass
class HeatmapPanel:
    """One heat-map: `grid[i - 1][j - 1]` is the accuracy in [0, 1] with i and j digits in the two operands."""

    grid: list[list[float]]
    title: str
    train_digits: int | None = None  # operands up to this length were trained on; None draws no box


def save_heatmaps(panels: list[HeatmapPanel], path: str | Path) -> Path:
    """Draw the panels side by side with one shared 0..1 colour bar and write a PNG atomically (tmp + rename)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.0, 4.4), squeeze=False)
    image = None
    for ax, panel in zip(axes[0], panels, strict=True):
        n = len(panel.grid)
        # Cell (i, j) is centred on (j, i), so the axes read as digit counts and (1, 1) sits bottom-left.
        image = ax.imshow(panel.grid, cmap="YlGnBu", vmin=0.0, vmax=1.0, origin="lower",
                          extent=(0.5, n + 0.5, 0.5, n + 0.5), interpolation="nearest")
        if panel.train_digits:
            box = min(panel.train_digits, n)
            ax.add_patch(Rectangle((0.5, 0.5), box, box, fill=False, edgecolor="red", linewidth=1.8))
        note = f"\nred box: trained lengths (<= {panel.train_digits} digits)" if panel.train_digits else ""
        ax.set_title(panel.title + note, fontsize=10)
        ax.set_xlabel("2nd number length (digits)")
        ax.set_ylabel("1st number length (digits)")
    fig.colorbar(image, ax=axes[0].tolist(), label="exact-match accuracy", fraction=0.046 / len(panels) ** 0.5)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


@dataclass
class BarSeries:
    """One bar per group: `values[k]` in [0, 1] (or None: no bar) for the k-th group."""

    label: str
    values: list[float | None]
    color: str | None = None  # a matplotlib colour; None = the next in the cycle
    hatch: str | None = None  # e.g. "//" to tell two series of one colour apart


def save_bars(groups: list[str], series: list[BarSeries], title: str, path: str | Path) -> Path:
    """Grouped bar chart (one group per name in `groups`, one bar per series, 0..1 axis), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + len(groups) * len(series) * 0.45), 3.8))
    for k, s in enumerate(series):
        xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar([x for x, v in zip(xs, s.values, strict=True) if v is not None],
               [v for v in s.values if v is not None], width, label=s.label, color=s.color, hatch=s.hatch,
               edgecolor="white" if s.hatch else None)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
