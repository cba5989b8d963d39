"""The PNGs of `tape analyze`, drawn from results.json alone (matplotlib, imported lazily; every file written
atomically by `tapecli.eval.plots.save_figure`).

    position_loss_plot(results, path)     loss (and accuracy) vs position: a line and a 95% band per model, each
                                          model's training length dashed, log-2 axis
    attention_plots(results, path)        path = heatmaps.png (layer x head per statistic, a row per model), and
                                          beside it distance.png, entropy.png, maps-<model>.png, pe-<model>.png

Curves per layer are the mean over heads, with the range over heads shaded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tapecli.eval.plots import save_figure
from tapecli.store.run import safe_name

STATS = {"mean_distance": "mean distance", "entropy": "entropy (nats)", "entropy_slope": "entropy slope vs ln(n)",
         "sink_mass": "mass on first {sink}", "local_mass": "mass within {window}"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _mark_lengths(ax: Any, models: list[dict[str, Any]]) -> None:
    """A dashed vertical line at each distinct training length."""
    for length in sorted({m["training_length"] for m in models if m.get("training_length")}):
        ax.axvline(length, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"L={length}", (length, 1), xycoords=("data", "axes fraction"), fontsize=7, color="grey",
                    xytext=(2, -10), textcoords="offset points")


def position_loss_plot(results: dict[str, Any], path: str | Path) -> Path:
    """Loss per position, one line and band per model; a second panel with accuracy for a synthetic task."""
    plt = _pyplot()
    models = results["models"]
    metrics = ["loss", "accuracy"] if results["settings"]["kind"] == "synthetic" else ["loss"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.0 * len(metrics), 4.0), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for k, model in enumerate(models):
            kept = [b for b in model["bins"] if b[metric] is not None]
            xs = [b["center"] for b in kept]
            ax.plot(xs, [b[metric] for b in kept], marker=".", color=f"C{k}", label=model["name"])
            banded = [b for b in kept if b[f"{metric}_band"]]
            if banded:
                ax.fill_between([b["center"] for b in banded], [b[f"{metric}_band"][0] for b in banded],
                                [b[f"{metric}_band"][1] for b in banded], color=f"C{k}", alpha=0.2, linewidth=0)
        _mark_lengths(ax, models)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position (tokens of context)")
        ax.set_ylabel("mean token loss (nats)" if metric == "loss" else "token accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    settings = results["settings"]
    fig.suptitle(f"{metric_title(settings)}; band: 95% interval over {settings['samples']} sequences", fontsize=10)
    return save_figure(fig, path)


def metric_title(settings: dict[str, Any]) -> str:
    data = settings["data"] if settings["kind"] == "synthetic" else Path(settings["data"]).name
    return f"{data}, {settings['seq_len']} tokens"


def attention_plots(results: dict[str, Any], path: str | Path) -> list[Path]:
    """Every attention PNG (module docstring); returns the paths written."""
    path = Path(path)
    written = [heatmaps(results, path), distance_plot(results, path.with_name("distance.png")),
               entropy_plot(results, path.with_name("entropy.png"))]
    for model in results["models"]:
        name = safe_name(model["name"])
        if model.get("maps"):
            written.append(maps_plot(model, path.with_name(f"maps-{name}.png")))
        if model.get("picture"):
            written.append(picture_plot(model, results["settings"]["seq_len"], path.with_name(f"pe-{name}.png")))
    return written


def heatmaps(results: dict[str, Any], path: Path) -> Path:
    """One layer x head heat-map per statistic (columns) and model (rows), each column on one colour scale (so
    models compare), every cell annotated while there are few."""
    plt = _pyplot()
    settings, models = results["settings"], results["models"]
    layers = max(len(m["stats"]["entropy"]) for m in models)
    fig, axes = plt.subplots(len(models), len(STATS), squeeze=False, layout="constrained",
                             figsize=(2.9 * len(STATS), 0.8 + (0.7 + 0.35 * layers) * len(models)))
    for col, (stat, title) in enumerate(STATS.items()):
        grids = [[[math.nan if v is None else v for v in layer] for layer in m["stats"][stat]] for m in models]
        finite = [v for grid in grids for row in grid for v in row if not math.isnan(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        for row, (model, grid) in enumerate(zip(models, grids, strict=True)):
            ax = axes[row][col]
            image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest", vmin=low,
                              vmax=high if high > low else low + 1e-9)
            if len(grid) * len(grid[0]) <= 64:
                for layer, values in enumerate(grid):
                    for head, value in enumerate(values):
                        if not math.isnan(value):
                            bright = high > low and (value - low) / (high - low) > 0.6
                            ax.text(head, layer, f"{value:.2g}", ha="center", va="center", fontsize=7,
                                    color="black" if bright else "white")
            ax.set_xticks(range(len(grid[0])))
            ax.set_yticks(range(len(grid)))
            ax.tick_params(labelsize=7)
            if row == len(models) - 1:
                ax.set_xlabel("head", fontsize=8)
            ax.set_ylabel(f"{model['name']}\nlayer" if col == 0 else "", fontsize=8)
            if row == 0:
                ax.set_title(title.format(sink=settings["sink"], window=settings["window"]), fontsize=9)
        fig.colorbar(image, ax=[axes[r][col] for r in range(len(models))], format="%.3g", aspect=30)
    fig.suptitle(f"attention per layer and head: {metric_title(settings)}", fontsize=10)
    return save_figure(fig, path)


def _layer_lines(ax: Any, xs: list[float], per_layer: list[list[list[float | None]]], names: list[str]) -> None:
    """One line per layer (mean over heads) and the range over heads shaded; per_layer[layer][head][bin]."""
    for k, heads in enumerate(per_layer):
        columns = list(zip(*heads, strict=True))
        kept = [(x, [v for v in col if v is not None]) for x, col in zip(xs, columns, strict=True)]
        kept = [(x, col) for x, col in kept if col]
        if not kept:
            continue
        ax.plot([x for x, _ in kept], [sum(c) / len(c) for _, c in kept], marker=".", color=f"C{k}", label=names[k])
        if len(heads) > 1:
            ax.fill_between([x for x, _ in kept], [min(c) for _, c in kept], [max(c) for _, c in kept],
                            color=f"C{k}", alpha=0.15, linewidth=0)


def distance_x(bins: int) -> list[float]:
    """x of each distance bin on a 'distance + 1' log axis: the geometric middle of the bin's distances + 1."""
    return [1.0] + [math.sqrt((2 ** (b - 1) + 1) * 2 ** b) for b in range(1, bins)]


def length_x(bins: int, seq_len: int) -> list[float]:
    """x of each length bin (1, 2-3, 4-7, ...): the geometric middle of its lengths."""
    return [math.sqrt(2 ** b * min(2 ** (b + 1) - 1, seq_len)) for b in range(bins)]


def _model_panels(results: dict[str, Any], path: Path, draw, xlabel: str, ylabel: str, title: str) -> Path:
    """One log2-x panel per model (`draw(ax, model)` draws its lines), its training length marked; written
    atomically."""
    plt = _pyplot()
    models = results["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.8), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models, strict=True):
        draw(ax, model)
        _mark_lengths(ax, [model])
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_title(model["name"], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(f"{title}: {metric_title(results['settings'])}", fontsize=10)
    return save_figure(fig, path)


def distance_plot(results: dict[str, Any], path: Path) -> Path:
    """Attention mass per distance bin, a panel per model, a line per layer."""

    def draw(ax, model: dict[str, Any]) -> None:
        histogram = model["stats"]["distance_histogram"]
        _layer_lines(ax, distance_x(len(histogram[0][0])), histogram,
                     [f"layer {k}" for k in range(len(histogram))])

    return _model_panels(results, path, draw, "distance i - j + 1",
                         "attention mass per distance bin (0, 1, 2-3, 4-7, ...)", "how far attention looks")


def entropy_plot(results: dict[str, Any], path: Path) -> Path:
    """Entropy against the number of keys a query sees, a panel per model, ln(n) (uniform attention) dashed."""
    seq_len = results["settings"]["seq_len"]

    def draw(ax, model: dict[str, Any]) -> None:
        by_length = model["stats"]["entropy_by_length"]
        xs = length_x(len(by_length[0][0]), seq_len)
        _layer_lines(ax, xs, by_length, [f"layer {k}" for k in range(len(by_length))])
        ax.plot(xs, [math.log(x) for x in xs], color="black", linestyle=":", linewidth=1, label="uniform: ln n")

    return _model_panels(results, path, draw, "keys seen n (query position + 1)", "attention entropy (nats)",
                         "entropy as the context grows")


def maps_plot(model: dict[str, Any], path: Path) -> Path:
    """The attention maps of the first sequence: a row per layer, a column per head (square-root colour scale)."""
    plt = _pyplot()
    from matplotlib.colors import PowerNorm

    maps = model["maps"]
    L, H = len(maps), len(maps[0])
    fig, axes = plt.subplots(L, H, figsize=(2.4 * H + 0.6, 2.4 * L + 0.4), squeeze=False)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(maps[layer][head], cmap="magma", norm=PowerNorm(0.5, vmin=0, vmax=1), interpolation="nearest")
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ax.set_xlabel("key", fontsize=7)
            ax.set_ylabel("query", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(f"{model['name']}: attention weights (sqrt colour scale)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def picture_plot(model: dict[str, Any], seq_len: int, path: Path) -> Path:
    """A contextual PE's picture (`pictures/`): a panel per curve, a line per layer, references dashed."""
    plt = _pyplot()
    picture = model["picture"]
    references = picture["references"]
    shown = [name for name in picture["curves"] if name not in references.values()]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.8 * len(shown), 3.8), squeeze=False)
    for ax, name in zip(axes[0], shown, strict=True):
        curve = picture["curves"][name]["values"]
        bins = len(curve[0][0])
        xs = distance_x(bins) if picture["x_kind"] == "distance" else length_x(bins, seq_len)
        _layer_lines(ax, xs, curve, picture["layers"])
        if name in references:
            reference = picture["curves"][references[name]]
            values = reference["values"][0][0]
            kept = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
            ax.plot([x for x, _ in kept], [v for _, v in kept], color="black", linestyle=":", linewidth=1,
                    label=reference["label"])
            ax.set_yscale("log", base=2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(picture["x_label"] + (" + 1" if picture["x_kind"] == "distance" else ""))
        ax.set_ylabel(picture["curves"][name]["label"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{model['name']}: {picture['title']}", fontsize=10)
    return save_figure(fig, path)
