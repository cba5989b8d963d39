"""The rich tables `tape analyze` prints, from results.json alone."""

from __future__ import annotations

from typing import Any


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def position_loss_table(results: dict[str, Any]):
    """One row per model: its training length L and the mean loss (accuracy for a synthetic task) over positions
    up to L, then L..2L, 2L..4L, ..."""
    from rich.table import Table

    synthetic = results["settings"]["kind"] == "synthetic"
    models = results["models"]
    labels = list(dict.fromkeys(r["label"] for m in models for r in m["ranges"]))
    what = "loss / token accuracy" if synthetic else "loss"
    table = Table(title=f"mean token {what} by position range ({results['settings']['seq_len']} tokens, "
                        f"{results['settings']['samples']} sequences)")
    for column in ("model", "pe", "L", *labels):
        table.add_column(column, justify="left" if column in ("model", "pe") else "right")
    for model in models:
        cells = {r["label"]: _number(r["loss"]) + (f" / {r['accuracy']:.0%}" if synthetic and r["accuracy"]
                                                    is not None else "") for r in model["ranges"]}
        table.add_row(model["name"], model["pe"], str(model["training_length"]), *(cells.get(k, "") for k in labels))
    return table


def attention_table(results: dict[str, Any]):
    """One row per model and layer: each statistic's mean over heads, and its range over heads."""
    from rich.table import Table

    settings = results["settings"]
    columns = {"mean_distance": "distance", "entropy": "entropy", "entropy_slope": "slope",
               "sink_mass": f"first {settings['sink']}", "local_mass": f"within {settings['window']}"}
    table = Table(title=f"attention per layer, mean over heads [min-max] ({settings['seq_len']} tokens, "
                        f"{settings['samples']} sequences): mean distance, entropy (nats), its slope against ln n, "
                        f"mass on the first {settings['sink']} tokens, mass within the last {settings['window']}")
    for column in ("model", "layer", *columns.values()):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model in results["models"]:
        stats = model["stats"]
        for layer in range(len(stats["entropy"])):
            cells = []
            for key in columns:
                heads = [v for v in stats[key][layer] if v is not None]
                cells.append("-" if not heads else f"{sum(heads) / len(heads):.3g} [{min(heads):.2g}-{max(heads):.2g}]")
            table.add_row(model["name"] if layer == 0 else "", str(layer), *cells)
    return table
