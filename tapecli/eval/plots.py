"""The evaluation plots: addition heat-maps (training box outlined), grouped accuracy bar charts, line plots
(perplexity or accuracy vs length) and labelled heat-maps (passkey depth x length; side by side, one per task, for the
long-context evaluations). Each writes a PNG atomically; matplotlib is imported lazily."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tapecli.files import atomic_path


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
    return save_figure(fig, path)


def save_line_plot(series: dict[str, list[tuple[float, float]]], path: str | Path, xlabel: str, ylabel: str,
                   title: str, log_x: bool = False, ylim: tuple[float, float] | None = None,
                   hline: float | None = None, xticks: dict[float, str] | None = None) -> Path:
    """One line with markers per series name ((x, y) points, drawn in x order), a dashed horizontal line at
    `hline` (e.g. a threshold), and the x ticks `xticks` ({x: label}; default matplotlib's); written atomically as a
    PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for name, points in series.items():
        xs, ys = zip(*sorted(points), strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o", label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    if log_x:
        ax.set_xscale("log", base=2)
    if xticks:
        ax.set_xticks(list(xticks), list(xticks.values()), fontsize=8)
        ax.minorticks_off()
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_grid_heatmap(grid: list[list[float]], path: str | Path, x_labels: list[str], y_labels: list[str],
                      xlabel: str, ylabel: str, title: str, colorbar: str = "accuracy") -> Path:
    """`grid[row][col]` in [0, 1] as a heat-map (row 0 at the top), each cell annotated (NaN: blank); written
    atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(x_labels), 1.2 + 0.45 * len(y_labels)))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    for r, row in enumerate(grid):
        for c, value in enumerate(row):
            if value != value:  # NaN: a cell with no samples stays blank
                continue
            ax.text(c, r, f"{value:.2f}".rstrip("0").rstrip(".") if value < 1 else "1", ha="center", va="center",
                    fontsize=7)
    ax.set_xticks(range(len(x_labels)), x_labels, fontsize=8)
    ax.set_yticks(range(len(y_labels)), y_labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label=colorbar)
    return save_figure(fig, path)


def save_grid_heatmaps(panels: list[tuple[str, list[list[float]]]], path: str | Path, x_labels: list[str],
                       y_labels: list[str], xlabel: str, ylabel: str, title: str, colorbar: str = "accuracy") -> Path:
    """Several `save_grid_heatmap` grids of one shape side by side ((panel title, grid) each; NaN: blank), one
    shared 0..1 colour bar; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 1.0 + 0.55 * len(x_labels)
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels) + 1.0, 1.6 + 0.4 * len(y_labels)),
                             squeeze=False)
    image = None
    for k, (ax, (name, grid)) in enumerate(zip(axes[0], panels, strict=True)):
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        for r, row in enumerate(grid):
            for c, value in enumerate(row):
                if value == value:
                    ax.text(c, r, f"{value:.2f}".rstrip("0").rstrip(".") if value < 1 else "1", ha="center",
                            va="center", fontsize=6)
        ax.set_xticks(range(len(x_labels)), x_labels, fontsize=7)
        ax.set_yticks(range(len(y_labels)), y_labels if k == 0 else [], fontsize=7)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label=colorbar, fraction=0.046 / len(panels) ** 0.5)
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as a PNG atomically (tmp + rename) and close it."""
    import matplotlib.pyplot as plt

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
    spread: list[tuple[float, float] | None] | None = None  # (low, high) per group: an error bar from low to high


def save_bars(groups: list[str], series: list[BarSeries], title: str, path: str | Path, ylabel: str = "accuracy",
              ylim: tuple[float, float] | None = (0, 1)) -> Path:
    """Grouped bar chart (one group per name in `groups`, one bar per series, with error bars where a series has a
    spread; a 0..1 axis unless `ylim` says otherwise), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + len(groups) * len(series) * 0.45), 3.8))
    for k, s in enumerate(series):
        xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(groups))]
        kept = [g for g, v in enumerate(s.values) if v is not None]
        ax.bar([xs[g] for g in kept], [s.values[g] for g in kept], width, label=s.label, color=s.color,
               hatch=s.hatch, edgecolor="white" if s.hatch else None)
        bars = [g for g in kept if s.spread and s.spread[g] is not None]
        if bars:  # whiskers from low to high around each bar's value
            ax.errorbar([xs[g] for g in bars], [s.values[g] for g in bars], fmt="none", ecolor="black",
                        elinewidth=1, capsize=3, yerr=[[s.values[g] - s.spread[g][0] for g in bars],
                                                       [s.spread[g][1] - s.values[g] for g in bars]])
    ax.set_xticks(range(len(groups)), groups)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    return save_figure(fig, path)
