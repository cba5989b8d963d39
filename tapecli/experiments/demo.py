"""`tape demo`: a small but real addition length-generalisation experiment, RoPE vs TAPE (plus any other PEs).

Every PE gets exactly the same recipe (the shipped `arithmetic` recipe, shrunk to a CPU budget by overrides):
same model size, same data stream, same steps, batch and learning rate. Each model is then evaluated on the
full grid of operand lengths up to twice the training length, and the demo prints one comparison table and
writes the heat-maps side by side. Re-running the same command reuses finished runs and evaluation cells.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.store.run import read_metrics

DEFAULT_PES = ("rope", "tape")


@dataclass(frozen=True)
class DemoBudget:
    """What every PE gets, identically: one model size, one training setting, one evaluation grid."""

    max_digits: int  # training operands have 1..max_digits digits
    eval_len: int  # the grid covers 1..eval_len digits per operand
    samples: int  # problems per grid cell
    steps: int
    batch_size: int
    lr: float
    n_layers: int
    dim: int
    n_heads: int

    def overrides(self, pe: str, seed: int, abacus: bool = False) -> list[str]:
        """`key=value` overrides that turn the shipped `arithmetic` recipe into this budget for one PE."""
        return [
            f"model.pe={pe}", f"model.abacus={str(abacus).lower()}", f"model.n_layers={self.n_layers}",
            f"model.dim={self.dim}", f"model.n_heads={self.n_heads}", "model.ffn_dim=null",
            f"model.max_seq_len={3 * self.eval_len + 4}",
            f"data.max_digits={self.max_digits}", f"data.seq_len={3 * self.max_digits + 4}",
            f"train.batch_size={self.batch_size}", f"train.micro_batch_size={self.batch_size}",
            f"train.max_steps={self.steps}", f"train.lr={self.lr}", "train.warmup=0.05",
            "train.precision=fp32",  # CPU: bf16 autocast is slow on most CPUs
            f"train.save_every={self.steps}", "train.eval_every=0", f"train.log_every={max(1, self.steps // 20)}",
            f"train.seed={seed}", f"eval.max_len={self.eval_len}", f"eval.samples={self.samples}",
        ]


# Sized on the project's 2-core CPU. Small models learn addition in a sudden drop of the loss whose timing varies
# a lot with the seed and learning rate (seen between steps ~700 and ~1,800 at 6 digits); FULL leaves a wide margin,
# so that what the grid shows beyond the training box is length generalisation, not under-training. QUICK is too
# short for that: it shows the pipeline and the shape of the result, not a comparison to quote.
FULL = DemoBudget(max_digits=5, eval_len=10, samples=100, steps=3000, batch_size=64, lr=1e-3, n_layers=4, dim=128,
                  n_heads=4)
QUICK = DemoBudget(max_digits=3, eval_len=6, samples=20, steps=1200, batch_size=32, lr=2e-3, n_layers=4, dim=128,
                   n_heads=4)


@dataclass
class DemoResult:
    """One PE's row of the comparison table."""

    pe: str
    parameters: int
    train_seconds: float
    final_loss: float  # training loss at the last logged step
    val_loss: float | None  # held-out in-distribution loss after the last step
    mean_accuracy: float  # over the whole grid, as the paper reports it
    in_box_accuracy: float | None  # None when the grid has no cell there
    out_of_box_accuracy: float | None


def run_demo(pes: list[str], budget: DemoBudget, out: str | Path, seed: int = 0,
             abacus: bool = False) -> list[DemoResult]:
    """Train and evaluate one model per PE under `budget` into `out/<pe>/`; print the table, write the heat-maps.

    `abacus` gives every PE the Abacus digit embedding (McLeish et al.), so they are still compared like with like.

    Writes `out/heatmaps.png` (all grids side by side) and `out/summary.json` (the budget and every row).
    """
    from rich.console import Console

    from tapecli.eval.addition import AdditionEvalSettings, evaluate_addition
    from tapecli.eval.plots import HeatmapPanel, save_heatmaps
    from tapecli.model import PE_NAMES, count_parameters
    from tapecli.recipe import load_recipe
    from tapecli.store.door import open_model
    from tapecli.train.engine import pretrain

    unknown = [pe for pe in pes if pe not in PE_NAMES]
    if unknown:  # before any training, not after the first models have taken minutes
        raise TapeError(f"--pe: unknown positional encoding {', '.join(unknown)}; allowed: {', '.join(PE_NAMES)}")
    out = Path(out)
    console = Console()
    results, panels = [], []
    for n, pe in enumerate(pes, start=1):
        run_dir = out / pe
        console.rule(f"[bold]{pe}[/] ({n}/{len(pes)}): train on 1-{budget.max_digits} digits, {budget.steps} steps")
        command = ["tape", "demo", *["--quick"] * (budget == QUICK), *["--abacus"] * abacus, "--pe", ",".join(pes),
                   "--seed", str(seed), "--out", str(out)]  # what resumes this demo (and is recorded in run.json)
        pretrain(load_recipe("arithmetic", budget.overrides(pe, seed, abacus)), run_dir, command=command)
        opened = open_model(str(run_dir), device="cpu")
        checkpoint, model, tokenizer = Path(opened.source), opened.model, opened.tokenizer
        console.rule(f"[bold]{pe}[/]: evaluate every length pair up to {budget.eval_len} digits")
        settings = AdditionEvalSettings(max_len=budget.eval_len, samples=budget.samples,
                                        train_digits=budget.max_digits, checkpoint=str(checkpoint.resolve()), pe=pe)
        grid = evaluate_addition(model, tokenizer, settings, run_dir / "eval-addition" / checkpoint.name)
        train = training_record(run_dir)
        results.append(DemoResult(
            pe=pe, parameters=count_parameters(model)["total"], train_seconds=train["elapsed"],
            final_loss=train["loss"], val_loss=train.get("val_loss"), mean_accuracy=grid["mean_accuracy"],
            in_box_accuracy=grid["in_box_accuracy"], out_of_box_accuracy=grid["out_of_box_accuracy"],
        ))
        panels.append(HeatmapPanel(grid["grid"], f"{pe}: mean accuracy {grid['mean_accuracy']:.1%}",
                                   budget.max_digits))
    save_heatmaps(panels, out / "heatmaps.png")
    summary = {"budget": asdict(budget), "seed": seed, "abacus": abacus, "results": [asdict(r) for r in results]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(_table(results, budget, abacus))
    console.print(f"heat-maps: {out / 'heatmaps.png'}; per-PE runs, results.json and samples.jsonl under {out}/<pe>/")
    return results


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


def _table(results: list[DemoResult], budget: DemoBudget, abacus: bool):
    from rich.table import Table

    box = budget.max_digits
    table = Table(
        title=f"Addition: train on 1-{box} digits, test on 1-{budget.eval_len} (greedy, exact match)",
        caption=(f"same budget for every PE: {budget.n_layers} layers x {budget.dim} wide, {budget.steps} steps x "
                 f"{budget.batch_size} problems, AdamW lr {budget.lr:g}{', Abacus digit embedding' if abacus else ''}; "
                 f"{budget.samples} problems per grid cell; one seed: at this scale, when the loss drops is "
                 "partly luck (compare with --seed N)"),
    )
    for column in ("PE", "params", "train time", "train loss", "val loss", "mean acc (grid)",
                   f"in box (<={box})", "out of box"):
        table.add_column(column, justify="left" if column == "PE" else "right")
    for r in results:
        table.add_row(
            r.pe, f"{r.parameters / 1e6:.2f}M", f"{r.train_seconds / 60:.1f} min", f"{r.final_loss:.3f}",
            "-" if r.val_loss is None else f"{r.val_loss:.3f}", f"{r.mean_accuracy:.1%}",
            *("-" if acc is None else f"{acc:.1%}" for acc in (r.in_box_accuracy, r.out_of_box_accuracy)),
        )
    return table
