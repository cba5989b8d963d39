"""A sweep's numbers, aggregated over seeds: DIR/results.json, a Rich table and the charts.

Only the cells' own files are read: each finished cell's evaluation results.json (RUN/eval-<name>/<checkpoint>/),
its metrics.jsonl (training time and loss) and its checkpoint's model_config.json (parameters). A group is one PE
(and one value of each --grid key); its statistics over the group's seeds are the mean, the sample standard
deviation (n - 1; none for a single seed), the min and the max of each (split, metric).

results.json:
    sweep        the recipe, overrides, PEs, seeds and grid (as in DIR/sweep.json)
    evaluation   its name, metrics and splits
    kind         the recipe's data.kind
    cells        per finished cell: name, pe, seed, grid, results (path of its results.json, relative to DIR),
                 scores {split: {metric: value}}, train {parameters, seconds, loss, val_loss, step}
    groups       per group: label, pe, grid, seeds, scores {split: {metric: {mean, std, min, max, n}}},
                 train {parameters, seconds, loss, val_loss} (seconds: mean; loss, val_loss: statistics)
    missing      cells not finished yet (left out of the groups)
(addition also keeps each cell's accuracy grid, grid_accuracy, and each group's mean grid, with train_digits.)
Charts: DIR/<evaluation.chart> (bars: the mean; whiskers: min to max over seeds) and, for addition, heatmaps.png
(each group's mean accuracy grid).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.experiments.sweep.cells import Cell, SweepSpec, cell_state
from tapecli.experiments.sweep.evaluations import Evaluation
from tapecli.files import write_json
from tapecli.store.run import read_metrics

RESULTS_FILE = "results.json"


def stats(values: list[float | None]) -> dict[str, float | int | None]:
    """mean, std (sample, n - 1; None below 2 values), min, max and n of the values that are not None."""
    kept = [v for v in values if v is not None]
    if not kept:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(kept), "std": statistics.stdev(kept) if len(kept) > 1 else None,
            "min": min(kept), "max": max(kept), "n": len(kept)}


def training_record(run_dir: Path) -> dict[str, Any]:
    """The last logged training row of a run (loss, cumulative elapsed seconds) plus its last validation loss."""
    rows = read_metrics(run_dir)
    train_rows = [row for row in rows if "loss" in row]
    if not train_rows:
        raise TapeError(f"{run_dir}/metrics.jsonl has no training rows")
    record = dict(train_rows[-1])
    val_rows = [row for row in rows if "val_loss" in row]
    if val_rows:
        record["val_loss"] = val_rows[-1]["val_loss"]
    return record


def _parameters(checkpoint: Path) -> int:
    """The model's parameter count, from its config alone (built on the meta device: no weights are read)."""
    import torch

    from tapecli.model import ModelConfig, Transformer, count_parameters
    from tapecli.store.checkpoint import read_model_config

    with torch.device("meta"):
        model = Transformer(ModelConfig.from_dict(read_model_config(checkpoint)))
    return count_parameters(model)["total"]


def _cell_entry(cell: Cell, checkpoint: Path, evaluation: Evaluation, out: Path) -> dict[str, Any]:
    import json

    from tapecli.faults import reading
    from tapecli.store.checkpoint import checkpoint_step

    path = evaluation.results_file(checkpoint)
    with reading(path):
        results = json.loads(path.read_text(encoding="utf-8"))
    train = training_record(cell.run_dir)
    return {"name": cell.name, "pe": cell.pe, "seed": cell.seed, "grid": dict(cell.grid),
            "results": str(path.relative_to(out)), "scores": evaluation.scores(results),
            "train": {"parameters": _parameters(checkpoint), "seconds": train["elapsed"], "loss": train["loss"],
                      "val_loss": train.get("val_loss"), "step": checkpoint_step(checkpoint)},
            **({"grid_accuracy": results["grid"], "train_digits": results["settings"]["train_digits"]}
               if evaluation.heatmaps else {})}


def aggregate(spec: SweepSpec, cells: list[Cell], recipes: dict[str, Any], evaluation: Evaluation) -> dict[str, Any]:
    """Read every finished cell, group by PE (and grid values), write DIR/results.json and the charts."""
    from tapecli.store.checkpoint import list_checkpoints
    from tapecli.store.run import CHECKPOINTS

    finished, missing = [], []
    for cell in cells:
        if cell_state(cell, recipes[cell.name], evaluation).finished:
            checkpoint = list_checkpoints(cell.run_dir / CHECKPOINTS)[-1]
            finished.append((cell, _cell_entry(cell, checkpoint, evaluation, spec.out)))
        else:
            missing.append(cell.name)
    entries = [entry for _, entry in finished]
    splits = list(dict.fromkeys(split for entry in entries for split in entry["scores"]))
    groups = []
    for label in dict.fromkeys(cell.label for cell in cells):
        members = [entry for cell, entry in finished if cell.label == label]
        if not members:
            continue
        first = members[0]
        groups.append({
            "label": label, "pe": first["pe"], "grid": first["grid"], "seeds": [e["seed"] for e in members],
            "scores": {split: {metric: stats([e["scores"].get(split, {}).get(metric) for e in members])
                               for metric in evaluation.metrics} for split in splits},
            "train": {"parameters": first["train"]["parameters"],
                      "seconds": statistics.fmean(e["train"]["seconds"] for e in members),
                      "loss": stats([e["train"]["loss"] for e in members]),
                      "val_loss": stats([e["train"]["val_loss"] for e in members])},
            **({"grid_accuracy": _mean_grid([e["grid_accuracy"] for e in members]),
                "train_digits": first["train_digits"]} if evaluation.heatmaps else {}),
        })
    results = {"sweep": spec.to_json(), "kind": next(iter(recipes.values())).data.kind,
               "evaluation": {"name": evaluation.name, "metrics": list(evaluation.metrics), "splits": splits},
               "cells": entries, "groups": groups, "missing": missing}
    write_json(spec.out / RESULTS_FILE, results)
    if groups:
        save_chart(results, evaluation, spec.out / evaluation.chart)
        if evaluation.heatmaps:
            save_heatmaps(results, spec.out / "heatmaps.png")
    return results


def _mean_grid(grids: list[list[list[float]]]) -> list[list[float]]:
    return [[statistics.fmean(cells) for cells in zip(*rows, strict=True)] for rows in zip(*grids, strict=True)]


def _several_seeds(results: dict[str, Any]) -> bool:
    return any(len(group["seeds"]) > 1 for group in results["groups"])


def save_chart(results: dict[str, Any], evaluation: Evaluation, path: Path) -> Path:
    """Grouped bars: one group per split, one colour per group of cells, one hatch per metric; bars at the mean,
    whiskers from the min to the max over seeds."""
    from tapecli.eval.plots import BarSeries, save_bars

    splits = results["evaluation"]["splits"]
    hatches = (None, "//", "xx", "..")
    series = []
    for k, group in enumerate(results["groups"]):
        for m, metric in enumerate(evaluation.metrics):
            cells = [group["scores"][split][metric] for split in splits]
            spread = [(s["min"], s["max"]) if s["n"] > 1 else None for s in cells]
            label = group["label"] + (f" {evaluation.labels[m]}" if len(evaluation.metrics) > 1 else "")
            series.append(BarSeries(label, [s["mean"] for s in cells], f"C{k % 10}", hatches[m % len(hatches)],
                                    spread))
    title = f"{results['kind']}: {evaluation.title}"
    if _several_seeds(results):
        title += " (mean over seeds; whiskers: min to max)"
    return save_bars(splits, series, title, path, ylabel="accuracy" if evaluation.percent else evaluation.metrics[0],
                     ylim=(0, 1) if evaluation.percent else None)


def save_heatmaps(results: dict[str, Any], path: Path) -> Path:
    """Each group's mean accuracy grid (addition), side by side, the training box outlined."""
    from tapecli.eval.plots import HeatmapPanel
    from tapecli.eval.plots import save_heatmaps as draw

    panels = []
    for group in results["groups"]:
        mean = statistics.fmean(value for row in group["grid_accuracy"] for value in row)  # the grid's mean
        seeds = f" ({len(group['seeds'])} seeds)" if len(group["seeds"]) > 1 else ""
        panels.append(HeatmapPanel(group["grid_accuracy"], f"{group['label']}: mean accuracy {mean:.1%}{seeds}",
                                   group["train_digits"]))
    return draw(panels, path)


def table(results: dict[str, Any], evaluation: Evaluation, title: str | None = None, caption: str | None = None):
    """One seed per group: one row per group, the metrics of each split as `a / b` (as `tape demo` always
    printed). Several: one row per group and metric, each value `mean ± std (min–max)` over the seeds."""
    from rich.markup import escape
    from rich.table import Table

    several = _several_seeds(results)
    spec, splits, metrics = results["sweep"], results["evaluation"]["splits"], evaluation.metrics
    default_title = f"{spec['recipe']}: {evaluation.title}" + (", mean ± std (min–max) over seeds" if several else "")
    overrides = " ".join(spec["overrides"])
    default_caption = (f"recipe {spec['recipe']}{' ' + overrides if overrides else ''}; seeds "
                       f"{', '.join(map(str, spec['seeds']))}")
    if results["missing"]:
        default_caption += f"; not finished (left out): {', '.join(results['missing'])}"
    view = Table(title=escape(title or default_title), caption=escape(caption or default_caption))  # overrides
    # may hold brackets (train.betas=[0.9,0.95]): plain text, not Rich markup
    by_metric = several and len(metrics) > 1
    val_loss = evaluation.name != "validation"
    columns = ["PE", *(["seeds"] if several else []), "params", "train time", "train loss",
               *(["val loss"] if val_loss else []), *(["metric"] if by_metric else []), *splits]
    for column in columns:
        view.add_column(column, justify="left" if column in ("PE", "metric") else "right")
    percent = "%" if evaluation.percent else ""

    def number(v: float) -> str:
        return f"{v * 100 if percent else v:.{evaluation.digits}f}"

    def value(e: dict[str, Any]) -> str:
        if e["n"] == 0:
            return "-"
        if e["std"] is None:
            return number(e["mean"]) + percent
        return f"{number(e['mean'])} ± {number(e['std'])}{percent} ({number(e['min'])}–{number(e['max'])})"

    def loss(e: dict[str, Any]) -> str:
        return "-" if e["n"] == 0 else f"{e['mean']:.3f}" + (f" ± {e['std']:.3f}" if e["std"] is not None else "")

    for group in results["groups"]:
        train = group["train"]
        head = [escape(group["label"]), *([str(len(group["seeds"]))] if several else []),
                f"{train['parameters'] / 1e6:.2f}M", _duration(train["seconds"]), loss(train["loss"]),
                *([loss(train["val_loss"])] if val_loss else [])]
        scores = group["scores"]
        if by_metric:
            for m, metric in enumerate(metrics):
                view.add_row(*(head if m == 0 else [""] * len(head)), evaluation.labels[m],
                             *(value(scores[split][metric]) for split in splits))
        else:
            view.add_row(*head, *(" / ".join(value(scores[split][m]) for m in metrics) for split in splits))
    return view


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
